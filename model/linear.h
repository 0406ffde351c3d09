// Linear: y = x W^T + b, W stored [out, in] as in PyTorch. Input [B, in]. With AmpMode::kBf16
// the three GEMMs (y, dW, dX) take bf16 operands with float32 accumulation, like autocast;
// weight, bias, their gradients and the output stay float32.
#pragma once

#include "model/init.h"
#include "model/module.h"

namespace dtrain {

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, Device device, InitRng& rng, bool bias = true);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, bool need_input_grad = true) override;
  std::vector<Parameter*> parameters() override;
  std::string describe() const override;
  void set_amp(AmpMode mode) override { amp_ = mode; }

 private:
  int64_t in_, out_;
  bool has_bias_;
  Parameter weight_, bias_;
  Tensor input_, output_, grad_input_;
  Tensor ones_;  // >= batch ones (core ones()): the bias gradient is the GEMM ones^T dY
  AmpMode amp_ = AmpMode::kOff;
  bool bf16_forward_ = false;  // the last forward ran in bf16: backward uses its packed operands
  // bf16 copies of the GEMM operands, refilled every step (the weight changes every step).
  Tensor input_bf16_, weight_bf16_, grad_output_bf16_;
};

}  // namespace dtrain
