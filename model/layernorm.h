// LayerNorm(C) over the last dimension, eps 1e-5, as torch.nn.LayerNorm: parameters "weight"
// (ones) and "bias" (zeros). forward caches each row's mean and 1/std for backward; the weight
// and bias gradients are summed over the rows in a fixed order per column (no atomics: the same
// bits on every thread count and device; Note [LayerNorm parameter gradient]).
#pragma once

#include "model/module.h"

namespace dtrain {

class LayerNorm : public Module {
 public:
  LayerNorm(int64_t channels, Device device, float eps = 1e-5f);
  Tensor forward(const Tensor& input) override;  // input (..., C)
  Tensor backward(const Tensor& grad_output, bool need_input_grad = true) override;
  void release_backward_scratch() override {
    grad_input_ = {};
    partial_ = {};
  }
  // backward that returns residual + d(input): a pre-LayerNorm block's input gradient, whose
  // other path (the residual connection) is `residual`, summed in the same pass.
  Tensor backward_add(const Tensor& grad_output, const Tensor& residual);
  std::vector<Parameter*> parameters() override { return {&weight_, &bias_}; }
  std::string describe() const override;

 private:
  Tensor backward_impl(const Tensor& grad_output, const float* residual, bool need_input_grad);

  int64_t channels_;
  float eps_;
  Parameter weight_, bias_;
  Tensor input_, output_, mean_, rstd_, grad_input_;
  Tensor partial_;  // (2, row chunks, C): Note [LayerNorm parameter gradient]
};

}  // namespace dtrain
