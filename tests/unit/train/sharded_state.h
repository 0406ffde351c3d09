// Synthesized optimizer state for the sharded-checkpoint tests (unit and MPI): a few named
// tensors of odd sizes, ZeRO-style slices of it (rank r owns a contiguous 1/n of the
// concatenated tensors, so a tensor may be split between ranks), and an Optimizer that exports
// and imports a given state, so the Checkpointer can be driven without a training run.
#pragma once

#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/optimizer_shards.h"
#include "model/optimizer.h"

namespace dtrain::testing {

inline OptimizerState full_state(int64_t seed = 1) {
  const std::vector<std::pair<std::string, Shape>> tensors = {
      {"0.bias.exp_avg", {3}},       {"0.bias.exp_avg_sq", {3}},     {"0.weight.exp_avg", {5, 7}},
      {"0.weight.exp_avg_sq", {5, 7}}, {"2.weight.exp_avg", {2, 2, 5}}, {"2.weight.exp_avg_sq", {2, 2, 5}}};
  OptimizerState s;
  int64_t k = 0;
  for (const auto& [name, shape] : tensors) {
    Tensor t = Tensor::empty(shape);
    for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = static_cast<float>(seed) + 0.01f * static_cast<float>(k++) + 1e-6f * static_cast<float>(i);
    s.tensors.push_back({name, t});
  }
  s.counts = {{"0.bias.step", 7 * seed}, {"0.weight.step", 7 * seed}, {"2.weight.step", 3 * seed}};
  return s;
}

// Rank r's pieces of `full` at n ranks: elements [r*T/n, (r+1)*T/n) of the tensors laid end to end.
inline std::vector<checkpoint::Piece> pieces_of(const OptimizerState& full, int rank, int n) {
  int64_t total = 0;
  for (const auto& e : full.tensors) total += e.value.numel();
  const int64_t lo = total * rank / n, hi = total * (rank + 1) / n;
  std::vector<checkpoint::Piece> out;
  int64_t start = 0;
  for (const auto& e : full.tensors) {
    const int64_t a = std::max(lo, start), b = std::min(hi, start + e.value.numel());
    if (a < b) out.push_back({e.name, a - start, b - a, e.value.shape()});
    start += e.value.numel();
  }
  return out;
}

// What a ZeRO optimizer on rank r of n exports: its slices (1-D) and the counts of the
// parameters it has slices of (as model/optimizer.h's ZeRO export keeps them).
inline OptimizerState slice_of(const OptimizerState& full, int rank, int n) {
  OptimizerState s;
  for (const checkpoint::Piece& p : pieces_of(full, rank, n)) {
    const Tensor* whole = nullptr;
    for (const auto& e : full.tensors)
      if (e.name == p.name) whole = &e.value;
    Tensor t = Tensor::empty({p.numel});
    std::memcpy(t.data(), whole->data() + p.offset, static_cast<size_t>(p.numel) * sizeof(float));
    s.tensors.push_back({p.name, t, p.offset, p.full_shape});
  }
  auto parameter = [](const std::string& name) { return name.substr(0, name.rfind('.')); };
  for (const OptimizerState::Count& c : full.counts)
    for (const auto& e : s.tensors)
      if (parameter(e.name) == parameter(c.name)) {
        s.counts.push_back(c);
        break;
      }
  return s;
}

// "" when `a` and `b` hold the same entries (names, offsets, full shapes, shapes, bits) in the same order.
inline std::string state_difference(const OptimizerState& a, const OptimizerState& b) {
  if (a.tensors.size() != b.tensors.size())
    return "tensor count " + std::to_string(a.tensors.size()) + " vs " + std::to_string(b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto &x = a.tensors[i], &y = b.tensors[i];
    if (x.name != y.name || x.offset != y.offset || x.full_shape != y.full_shape || x.value.shape() != y.value.shape())
      return "entry " + std::to_string(i) + ": " + x.name + " vs " + y.name;
    if (std::memcmp(x.value.raw(), y.value.raw(), x.value.nbytes()) != 0) return "values of " + x.name;
  }
  if (a.counts.size() != b.counts.size()) return "count count";
  for (size_t i = 0; i < a.counts.size(); ++i)
    if (a.counts[i].name != b.counts[i].name || a.counts[i].value != b.counts[i].value) return "count " + a.counts[i].name;
  return "";
}

// An optimizer holding a given state: export_state() returns it, import_state() keeps what it got.
class FixedStateOptimizer final : public Optimizer {
 public:
  explicit FixedStateOptimizer(OptimizerState state = {}) : Optimizer({}, 0.f), state_(std::move(state)) {}
  void step() override {}
  OptimizerKind kind() const override { return OptimizerKind::kAdamW; }
  OptimizerState export_state() const override { return state_; }
  void import_state(const OptimizerState& state) override { state_ = state; }
  const OptimizerState& state() const { return state_; }

 private:
  OptimizerState state_;
};

}  // namespace dtrain::testing
