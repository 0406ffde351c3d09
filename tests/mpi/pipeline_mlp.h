// The MLP the pipeline tests train (tests/mpi/pipeline_test.cpp on CPU, tests/gpu/
// pipeline_nccl_test.cpp on GPUs): the model, its stages, and each step's global batch.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "model/models.h"
#include "model/optimizer.h"
#include "pipeline/partition.h"

namespace dtrain::testing::pipeline_mlp {

constexpr int64_t kRowsPerReplica = 8;
inline const Shape kSample = {1, 8, 8};

inline std::unique_ptr<Sequential> make_mlp(Device device = Device::cpu()) {
  ModelSpec spec;
  spec.hidden = {24, 20, 16, 12};
  return build_model(spec, kSample, 10, device, /*seed=*/7);
}

inline SgdOptions sgd() { return SgdOptions{0.05f, 0.9f, 0.f, 1e-4f, false}; }

struct Batch {
  Tensor x, y;
};

// Step `step`'s global batch (replicas x kRowsPerReplica rows), the same on every rank.
inline Batch global_batch(int step, int replicas) {
  const int64_t rows = kRowsPerReplica * replicas;
  std::mt19937 gen(1000 + static_cast<uint32_t>(step));
  std::uniform_real_distribution<float> px(0.f, 1.f);
  std::uniform_int_distribution<int> cls(0, 9);
  std::vector<float> x(static_cast<size_t>(rows * 64));
  for (float& v : x) v = px(gen);
  Batch b{Tensor::from_vector(x, {rows, 1, 8, 8}), Tensor::empty({rows}, Device::cpu(), DType::kI32)};
  for (int64_t i = 0; i < rows; ++i) b.y.data_as<int32_t>()[i] = cls(gen);
  return b;
}

inline Batch rows_of(const Batch& b, int64_t first, int64_t count) {
  return {b.x.slice(first * 64, {count, 1, 8, 8}), b.y.slice(first, {count})};
}

// This rank's stage of the MLP cut into `stages` (balanced by parameter count), on `device`.
inline std::unique_ptr<Sequential> stage_of(int stages, int stage, Device device = Device::cpu()) {
  auto full = make_mlp(device);
  std::vector<int64_t> counts;
  for (size_t i = 0; i < full->size(); ++i) {
    int64_t n = 0;
    for (Parameter* p : full->layer(i).parameters()) n += p->value.numel();
    counts.push_back(n);
  }
  const StageRange range = balanced_partition(counts, stages)[static_cast<size_t>(stage)];
  auto layers = full->release_layers();
  std::vector<std::unique_ptr<Module>> mine;
  for (size_t i = range.begin; i < range.end; ++i) mine.push_back(std::move(layers[i]));
  return Sequential::of_named_layers(std::move(mine));
}

}  // namespace dtrain::testing::pipeline_mlp
