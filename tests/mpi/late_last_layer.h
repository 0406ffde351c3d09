// LateLastLayer: an MLP whose last layer reports its gradients after the whole backward, so
// that DDP rebuilds its buckets after the first step (Note [Rebuilding buckets] in ddp/reducer.h).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/models.h"
#include "model/module.h"

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

}  // namespace dtrain::testing
