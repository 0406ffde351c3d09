// The built-in models: `mlp` (Flatten, then Linear+ReLU per hidden width, then Linear to the
// classes; default 784-256-10, the seeds' model) and `cnn` (LeNet-5 style for 28x28 images).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/sequential.h"

namespace dtrain {

struct ModelSpec {
  std::string name = "mlp";
  std::vector<int64_t> hidden = {256};  // mlp only
  float dropout = 0.f;                  // after each hidden activation
};

std::unique_ptr<Sequential> build_model(const ModelSpec& spec, const Shape& sample_shape, int num_classes,
                                        Device device, uint64_t seed);

}  // namespace dtrain
