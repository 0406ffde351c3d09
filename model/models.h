// The built-in models: `mlp` (Flatten, then Linear+ReLU per hidden width, then Linear to the
// classes; default 784-256-10, the seeds' model) and `cnn` (LeNet-5 style for 28x28 images).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/sequential.h"

namespace dtrain {

enum class ModelKind { kMlp, kCnn };
const char* model_kind_name(ModelKind kind);                      // "mlp", "cnn"
std::optional<ModelKind> parse_model_kind(const std::string& name);  // the names above

struct ModelSpec {
  ModelKind kind = ModelKind::kMlp;
  std::vector<int64_t> hidden = {256};  // mlp only; every width positive
  float dropout = 0.f;                  // after each hidden activation, in [0, 1)
};

std::unique_ptr<Sequential> build_model(const ModelSpec& spec, const Shape& sample_shape, int num_classes,
                                        Device device, uint64_t seed);

}  // namespace dtrain
