// Synthetic checkpoints for the checkpoint tests and their helper program: values that depend on
// the step, so a test can tell which checkpoint it loaded and that every byte came back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/checkpoint_writer.h"
#include "core/tensor.h"

namespace dtrain::testing {

inline float synthetic_value(int64_t step, int64_t tensor, int64_t i) {
  return static_cast<float>(step) + 0.001f * static_cast<float>(tensor) + 1e-7f * static_cast<float>(i % 1000);
}

inline Tensor synthetic_tensor(int64_t step, int64_t tensor, const Shape& shape) {
  Tensor t = Tensor::empty(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = synthetic_value(step, tensor, i);
  return t;
}

inline nlohmann::json synthetic_config() {
  return {{"model", {{"name", "mlp"}, {"hidden", {256}}}}, {"batch_size", 64}, {"optimizer", "sgd"}, {"epochs", 3}};
}

// A model of two tensors ("0.weight" of `numel` floats and "0.bias") and SGD momentum state.
inline checkpoint::CheckpointSnapshot synthetic_snapshot(int64_t step, int64_t numel = 1000) {
  checkpoint::CheckpointSnapshot s;
  s.state.epoch = step / 10;
  s.state.step_in_epoch = step % 10;
  s.state.sample_in_epoch = (step % 10) * 64;
  s.state.global_step = step;
  s.state.samples_seen = step * 64;
  s.state.world_size = 2;
  s.state.seed = 42;
  s.state.rng = {{"sampler_epoch", step / 10}, {"dropout", "0123456789abcdef"}};
  s.state.lr_schedule_position = step / 10;
  s.state.lr = 0.1f;
  s.state.config = synthetic_config();
  s.model.push_back(safetensors::host_copy("0.weight", synthetic_tensor(step, 0, {numel})));
  s.model.push_back(safetensors::host_copy("0.bias", synthetic_tensor(step, 1, {10})));
  s.model_metadata = {{"format", "pt"}, {"dtrain.model", "test"}};
  s.optimizer.push_back(safetensors::host_copy("0.weight.momentum_buffer", synthetic_tensor(step, 2, {numel})));
  s.optimizer.push_back(safetensors::host_copy("0.bias.momentum_buffer", synthetic_tensor(step, 3, {10})));
  s.optimizer_metadata = {{"dtrain.optimizer", "sgd"}};
  return s;
}

// Empty when `file` holds exactly what synthetic_snapshot(step, numel) wrote, else what differs.
inline std::string synthetic_mismatch(const safetensors::File& model, const safetensors::File& optimizer, int64_t step,
                                      int64_t numel = 1000) {
  struct Want {
    const safetensors::File* file;
    const char* name;
    int64_t tensor, numel;
  };
  for (const Want& w : {Want{&model, "0.weight", 0, numel}, Want{&model, "0.bias", 1, 10},
                        Want{&optimizer, "0.weight.momentum_buffer", 2, numel},
                        Want{&optimizer, "0.bias.momentum_buffer", 3, 10}}) {
    if (!w.file->find(w.name)) return std::string("missing ") + w.name;
    Tensor t = w.file->to_tensor(w.name);
    if (t.shape() != Shape{w.numel}) return std::string("shape of ") + w.name;
    for (int64_t i = 0; i < w.numel; ++i)
      if (t.data()[i] != synthetic_value(step, w.tensor, i)) return std::string("value of ") + w.name;
  }
  return "";
}

// The same for a checkpoint read back (its optimizer file read whole: these are small).
inline std::string synthetic_mismatch(const checkpoint::LoadedCheckpoint& c, int64_t step, int64_t numel = 1000) {
  if (c.optimizer.sharded()) return "sharded optimizer state";
  return synthetic_mismatch(c.model, safetensors::read_file(c.optimizer.sources().front()), step, numel);
}

}  // namespace dtrain::testing
