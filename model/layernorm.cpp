#include "model/layernorm.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/ops.h"
#include "model/cpu_kernels.h"
#include "model/gpt_kernels.h"

namespace dtrain {

LayerNorm::LayerNorm(int64_t channels, Device device, float eps) : channels_(channels), eps_(eps) {
  DTRAIN_CHECK(channels > 0, "LayerNorm({}): the channel count must be positive", channels);
  weight_ = {"weight", Tensor::empty({channels}, device), Tensor::zeros({channels}, device)};
  bias_ = {"bias", Tensor::zeros({channels}, device), Tensor::zeros({channels}, device)};
  fill(weight_.value, 1.f);
}

Tensor LayerNorm::forward(const Tensor& input) {
  DTRAIN_CHECK(input.ndim() >= 1 && input.dim(-1) == channels_, "LayerNorm({}) got input {}", channels_,
               shape_str(input.shape()));
  const Device dev = weight_.value.device();
  const int64_t rows = input.numel() / channels_;
  input_ = input;
  ensure_tensor(output_, input.shape(), dev);
  ensure_tensor(mean_, {rows}, dev);
  ensure_tensor(rstd_, {rows}, dev);
  if (dev.is_cpu()) {
    cpu::layernorm_forward(input.data(), weight_.value.data(), bias_.value.data(), rows, channels_, eps_,
                           output_.data(), mean_.data(), rstd_.data());
    return output_;
  }
  launch_rows(dev, rows,
              kernels::LayerNormForward{output_.data(), mean_.data(), rstd_.data(), input.data(), weight_.value.data(),
                                   bias_.value.data(), channels_, eps_});
  return output_;
}

Tensor LayerNorm::backward_impl(const Tensor& grad_output, const float* residual, bool need_input_grad) {
  const Device dev = weight_.value.device();
  const int64_t rows = input_.numel() / channels_;
  DTRAIN_CHECK(grad_output.numel() == input_.numel(), "LayerNorm backward got {} for input {}",
               shape_str(grad_output.shape()), shape_str(input_.shape()));
  // Parameters first (bias, then weight: reverse order), so their all-reduce overlaps dx (on the
  // CPU dx comes from the same pass, before the hooks).
  const float beta_b = take_grad_beta(bias_), beta_w = take_grad_beta(weight_);
  // Note [LayerNorm parameter gradient]
  const int64_t chunks = (rows + kernels::kLayerNormChunk - 1) / kernels::kLayerNormChunk;
  ensure_tensor(partial_, {2, chunks, channels_}, dev);
  if (dev.is_cpu()) {  // both steps in one pass over the rows (cpu::layernorm_backward)
    if (need_input_grad) ensure_tensor(grad_input_, input_.shape(), dev);
    cpu::layernorm_backward(grad_output.data(), input_.data(), mean_.data(), rstd_.data(), weight_.value.data(),
                            residual, rows, channels_, partial_.data(), need_input_grad ? grad_input_.data() : nullptr);
    launch(dev, channels_,
           kernels::LayerNormParamGrad{weight_.grad.data(), bias_.grad.data(), partial_.data(), channels_, chunks,
                                       beta_w, beta_b});
    grad_ready(bias_);
    grad_ready(weight_);
    return need_input_grad ? grad_input_ : Tensor{};
  }
  launch(dev, chunks * channels_,
         kernels::LayerNormParamPartial{partial_.data(), grad_output.data(), input_.data(), mean_.data(), rstd_.data(),
                                        rows, channels_, chunks});
  launch(dev, channels_,
         kernels::LayerNormParamGrad{weight_.grad.data(), bias_.grad.data(), partial_.data(), channels_, chunks, beta_w,
                                     beta_b});
  grad_ready(bias_);
  grad_ready(weight_);
  if (!need_input_grad) return {};
  ensure_tensor(grad_input_, input_.shape(), dev);
  launch_rows(dev, rows,
              kernels::LayerNormBackward{grad_input_.data(), grad_output.data(), input_.data(), mean_.data(), rstd_.data(),
                                    weight_.value.data(), residual, channels_});
  return grad_input_;
}

Tensor LayerNorm::backward(const Tensor& grad_output, bool need_input_grad) {
  return backward_impl(grad_output, nullptr, need_input_grad);
}

Tensor LayerNorm::backward_add(const Tensor& grad_output, const Tensor& residual) {
  DTRAIN_CHECK(residual.numel() == input_.numel(), "LayerNorm backward_add got residual {} for input {}",
               shape_str(residual.shape()), shape_str(input_.shape()));
  return backward_impl(grad_output, residual.data(), true);
}

std::string LayerNorm::describe() const { return fmt::format("LayerNorm({})", channels_); }

}  // namespace dtrain
