// Linear: y = x W^T + b, W stored [out, in] as in PyTorch. Input [B, in]. A following ReLU can
// be fused (Note [Fused ReLU]): y = ReLU(x W^T + b). With AmpMode::kBf16 or kFp16 the three
// GEMMs (y, dW, dX) take bf16 or fp16 operands with float32 accumulation, like autocast; weight,
// bias, their gradients and the output stay float32.
#pragma once

#include "model/init.h"
#include "model/module.h"

namespace dtrain {

// GPT-2's initialisation of a Linear: weight N(0, std^2), bias zero (attention's and the MLP's).
struct NormalInit {
  float std;
};

class Linear : public Module {
 public:
  // PyTorch's default: weight and bias U(-1/sqrt(in), 1/sqrt(in)), drawn from rng in that order.
  Linear(int64_t in_features, int64_t out_features, Device device, InitRng& rng, bool bias = true);
  // With a bias, initialised as `init` says; the weight's in x out normal draws come from rng.
  Linear(int64_t in_features, int64_t out_features, Device device, InitRng& rng, NormalInit init);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, bool need_input_grad = true) override;
  void release_backward_scratch() override;
  std::vector<Parameter*> parameters() override;
  std::string describe() const override;
  void set_amp(AmpMode mode) override { amp_ = mode; }
  bool absorb_following_relu() override { return relu_ = true; }

 private:
  Linear(int64_t in_features, int64_t out_features, Device device, bool bias);  // allocated, not initialised
  Tensor pre_activation_grad(const Tensor& grad_output);

  int64_t in_, out_;
  bool has_bias_;
  bool relu_ = false;  // output is ReLU(x W^T + b): Note [Fused ReLU]
  Parameter weight_, bias_;
  Tensor input_, output_, grad_input_;
  Tensor masked_;  // with a fused ReLU: dY masked by the output (the gradient of x W^T + b)
  Tensor ones_;  // >= batch ones (core ones()): the bias gradient is the GEMM ones^T dY
  AmpMode amp_ = AmpMode::kOff;
  DType half_ = DType::kF32;  // the last forward's operand format: backward uses its packed operands
  // 16-bit copies of the GEMM operands, refilled every step (the weight changes every step).
  Tensor input_half_, weight_half_, grad_output_half_;
};

}  // namespace dtrain
