// What the bucket-rebuild and ZeRO tests share: LateLastLayer, an MLP whose last layer reports its
// gradients after the whole backward, so that DDP rebuilds its buckets after the first step (Note
// [Rebuilding buckets] in ddp/reducer.h); a rank's batch of a step; a check across ranks.
#pragma once

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "model/models.h"
#include "comm/exchange.h"
#include "model/module.h"
#include "tests/mpi/mpi_test_env.h"

namespace dtrain::testing {

// A chain of layers whose last layer reports its gradients only after the whole backward, as a
// branch that finishes late would: with `hold_back_last_layer`, a 32-16 MLP's parameters
// (0.weight 0.bias 2.weight 2.bias 4.weight 4.bias = indices 0..5) become ready in the order
// 3 2 1 0 5 4 instead of 5 4 3 2 1 0.
class LateLastLayer : public Module {
 public:
  LateLastLayer(uint64_t seed, bool hold_back_last_layer)
      : net_(build_model(ModelSpec{ModelKind::kMlp, {32, 16}}, {1, 8, 8}, 10, Device::cpu(), seed)),
        hold_(hold_back_last_layer) {
    const auto params = net_->parameters();
    late_ = {params[params.size() - 2], params[params.size() - 1]};
  }
  Tensor forward(const Tensor& x) override { return net_->forward(x); }
  Tensor backward(const Tensor& grad, bool need_input_grad) override {
    Tensor g = net_->backward(grad, need_input_grad);
    for (Parameter* p : std::exchange(held_, {})) grad_ready(*p);
    return g;
  }
  std::vector<Parameter*> parameters() override { return net_->parameters(); }
  void set_grad_ready_hook(GradReadyHook hook) override {
    Module::set_grad_ready_hook(hook);
    net_->set_grad_ready_hook([this, hook](Parameter& p) {
      if (hold_ && (&p == late_[0] || &p == late_[1]))
        held_.push_back(&p);
      else if (hook)
        hook(p);
    });
  }
  std::string describe() const override { return "LateLastLayer"; }

 private:
  std::unique_ptr<Sequential> net_;
  bool hold_;
  std::vector<Parameter*> late_, held_;
};

// Rank-dependent data, the same for every model of this rank at a given step.
inline std::pair<Tensor, Tensor> rank_batch(int step) {
  std::mt19937 gen(static_cast<uint32_t>(1000 * step + test_comm().rank()));
  std::uniform_real_distribution<float> px(0.f, 1.f);
  std::vector<float> images(4 * 64);
  for (float& v : images) v = px(gen);
  Tensor x = Tensor::from_vector(images, {4, 1, 8, 8});
  Tensor y = Tensor::empty({4}, Device::cpu(), DType::kI32);
  std::vector<int32_t> labels(4);
  for (int32_t& l : labels) l = static_cast<int32_t>(gen() % 10);
  std::memcpy(y.raw(), labels.data(), sizeof(int32_t) * 4);
  return {x, y};
}

// True on every rank iff every rank's `mine` equals rank 0's.
inline bool same_on_all_ranks(const std::string& mine) {
  int32_t differ = broadcast_string(test_comm(), mine, 0) != mine;
  test_comm().allreduce(&differ, 1, DType::kI32, ReduceOp::kSum);
  return differ == 0;
}

}  // namespace dtrain::testing
