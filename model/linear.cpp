#include "model/linear.h"

#include "core/error.h"
#include "core/kernels.h"
#include "core/ops.h"
#include "model/cpu_kernels.h"
#include "model/kernels.h"

namespace dtrain {

Linear::Linear(int64_t in_features, int64_t out_features, Device device, bool bias)
    : in_(in_features), out_(out_features), has_bias_(bias) {
  DTRAIN_CHECK(in_ > 0 && out_ > 0, "Linear({}, {}): feature counts must be positive", in_, out_);
  checked_mul(out_, in_, fmt::format("Linear({}, {}) weight", in_, out_));  // before any allocation
  weight_ = {"weight", Tensor::empty({out_, in_}, device), Tensor::zeros({out_, in_}, device)};
  if (has_bias_) bias_ = {"bias", Tensor::empty({out_}, device), Tensor::zeros({out_}, device)};
}

Linear::Linear(int64_t in_features, int64_t out_features, Device device, InitRng& rng, bool bias)
    : Linear(in_features, out_features, device, bias) {
  uniform_init(weight_.value, fan_in_bound(in_), rng);
  if (has_bias_) uniform_init(bias_.value, fan_in_bound(in_), rng);
}

Linear::Linear(int64_t in_features, int64_t out_features, Device device, InitRng& rng, NormalInit init)
    : Linear(in_features, out_features, device, true) {
  normal_init(weight_.value, init.std, rng);  // the weight's draws only: rng advances by in x out
  bias_.value.zero_();
}

Tensor Linear::forward(const Tensor& input) {
  DTRAIN_CHECK(input.ndim() == 2 && input.dim(1) == in_, "Linear({}, {}) got input {}", in_, out_,
               shape_str(input.shape()));
  const Device dev = weight_.value.device();
  const int64_t batch = input.dim(0);
  input_ = input;
  ensure_tensor(output_, {batch, out_}, dev);
  float beta = 0.f;
  if (has_bias_) {  // bias becomes the GEMM's C: it costs the pass that would zero C anyway
    if (dev.is_cpu())
      cpu::broadcast_rows(bias_.value.data(), batch, out_, output_.data());
    else
      launch(dev, output_.numel(), kernels::BroadcastRows{output_.data(), bias_.value.data(), out_});
    beta = 1.f;
  }
  half_ = amp_operand_dtype(amp_);
  if (half_ != DType::kF32) {
    pack_half(half_, input, input_half_);
    pack_half(half_, weight_.value, weight_half_);
    gemm_half(dev, half_, false, true, batch, out_, in_, 1.f, input_half_.data_as<uint16_t>(),
              weight_half_.data_as<uint16_t>(), beta, output_.data());
  } else {
    gemm(dev, false, true, batch, out_, in_, 1.f, input.data(), weight_.value.data(), beta, output_.data());
  }
  // The fused ReLU, in place while the output is still in cache: the floats ReLU::forward gives.
  if (relu_) launch(dev, output_.numel(), kernels::ReluForward{output_.data(), output_.data()});
  return output_;
}

// The gradient of x W^T + b: dY masked by a fused ReLU's output. On the CPU the bias gradient
// comes from the same pass; on the GPU it is the GEMM ones^T dz. Fires the bias hook.
Tensor Linear::pre_activation_grad(const Tensor& grad_output) {
  const Device dev = weight_.value.device();
  const int64_t batch = input_.dim(0);
  if (relu_) ensure_tensor(masked_, {batch, out_}, dev);
  Tensor dz = relu_ ? masked_ : grad_output;
  const float beta = has_bias_ ? take_grad_beta(bias_) : 0.f;  // before reading bias_.grad (module.h)
  if (dev.is_cpu()) {
    if (relu_ || has_bias_)
      cpu::relu_backward_bias(grad_output.data(), relu_ ? output_.data() : nullptr, batch, out_,
                              relu_ ? masked_.data() : nullptr, has_bias_ ? bias_.grad.data() : nullptr, beta);
  } else {
    if (relu_) launch(dev, masked_.numel(), kernels::ReluBackward{masked_.data(), grad_output.data(), output_.data()});
    if (has_bias_)
      gemm(dev, false, false, 1, out_, batch, 1.f, ones(ones_, batch, dev), dz.data(), beta, bias_.grad.data());
  }
  if (has_bias_) grad_ready(bias_);
  return dz;
}

Tensor Linear::backward(const Tensor& grad_output, bool need_input_grad) {
  const Device dev = weight_.value.device();
  const int64_t batch = input_.dim(0);
  DTRAIN_CHECK(grad_output.numel() == batch * out_, "Linear backward got {}", shape_str(grad_output.shape()));
  // Bias first, then weight: reverse parameter order, and each hook fires before the
  // input-gradient GEMM so its all-reduce overlaps that GEMM.
  const Tensor dz = pre_activation_grad(grad_output);
  const float beta = take_grad_beta(weight_);  // before reading weight_.grad (module.h)
  if (half_ != DType::kF32) {  // dW = dZ^T X against forward's packed input; dX = dZ W against its packed weight
    pack_half(half_, dz, grad_output_half_);
    const uint16_t* dy = grad_output_half_.data_as<uint16_t>();
    gemm_half(dev, half_, true, false, out_, in_, batch, 1.f, dy, input_half_.data_as<uint16_t>(),
              beta, weight_.grad.data());
    grad_ready(weight_);
    if (!need_input_grad) return {};
    ensure_tensor(grad_input_, {batch, in_}, dev);
    gemm_half(dev, half_, false, false, batch, in_, out_, 1.f, dy, weight_half_.data_as<uint16_t>(), 0.f,
              grad_input_.data());
    return grad_input_;
  }
  gemm(dev, true, false, out_, in_, batch, 1.f, dz.data(), input_.data(), beta, weight_.grad.data());
  grad_ready(weight_);
  if (!need_input_grad) return {};
  ensure_tensor(grad_input_, {batch, in_}, dev);
  gemm(dev, false, false, batch, in_, out_, 1.f, dz.data(), weight_.value.data(), 0.f, grad_input_.data());
  return grad_input_;
}

void Linear::release_backward_scratch() {
  grad_input_ = {};
  masked_ = {};
  grad_output_half_ = {};
}

std::vector<Parameter*> Linear::parameters() {
  if (has_bias_) return {&weight_, &bias_};
  return {&weight_};
}

std::string Linear::describe() const { return fmt::format("Linear({}, {})", in_, out_); }

}  // namespace dtrain
