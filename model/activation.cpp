#include "model/activation.h"

#include "core/error.h"
#include "model/gpt_kernels.h"
#include "model/kernels.h"

namespace dtrain {

Tensor ReLU::forward(const Tensor& input) {
  if (fused_) return input;
  ensure_tensor(output_, input.shape(), input.device());
  launch(input.device(), input.numel(), kernels::ReluForward{output_.data(), input.data()});
  return output_;
}

Tensor ReLU::backward(const Tensor& grad_output, bool need_input_grad) {
  if (!need_input_grad) return {};
  if (fused_) return grad_output;
  ensure_tensor(grad_input_, output_.shape(), output_.device());
  launch(output_.device(), output_.numel(),
         kernels::ReluBackward{grad_input_.data(), grad_output.data(), output_.data()});
  return grad_input_;
}

Tensor GELU::forward(const Tensor& input) {
  input_ = input;
  ensure_tensor(output_, input.shape(), input.device());
  launch(input.device(), input.numel(), kernels::GeluForward{output_.data(), input.data()});
  return output_;
}

Tensor GELU::backward_in_place(Tensor grad_output) {
  DTRAIN_CHECK(grad_output.numel() == input_.numel(), "GELU backward got {} for input {}",
               shape_str(grad_output.shape()), shape_str(input_.shape()));
  // dx[i] = dy[i] * GELU'(x[i]): each element read before it is written, so dx may be dy.
  launch(input_.device(), input_.numel(), kernels::GeluBackward{grad_output.data(), grad_output.data(), input_.data()});
  return grad_output;
}

Tensor GELU::backward(const Tensor& grad_output, bool need_input_grad) {
  if (!need_input_grad) return {};
  DTRAIN_CHECK(grad_output.numel() == input_.numel(), "GELU backward got {} for input {}",
               shape_str(grad_output.shape()), shape_str(input_.shape()));
  ensure_tensor(grad_input_, input_.shape(), input_.device());
  launch(input_.device(), input_.numel(), kernels::GeluBackward{grad_input_.data(), grad_output.data(), input_.data()});
  return grad_input_;
}

Tensor Flatten::forward(const Tensor& input) {
  DTRAIN_CHECK(input.ndim() >= 1, "Flatten of a 0-d tensor");
  input_shape_ = input.shape();
  return input.view({input.dim(0), input.numel() / std::max<int64_t>(input.dim(0), 1)});
}

Tensor Flatten::backward(const Tensor& grad_output, bool need_input_grad) {
  if (!need_input_grad) return {};
  return grad_output.view(input_shape_);
}

Dropout::Dropout(float p, uint64_t seed) : p_(p), seed_(seed) {
  DTRAIN_CHECK(p >= 0.f && p < 1.f, "Dropout probability {} outside [0, 1)", p);
}

Tensor Dropout::forward(const Tensor& input) {
  masked_ = training() && p_ > 0.f;
  if (!masked_) return input;
  ensure_tensor(output_, input.shape(), input.device());
  ensure_tensor(mask_, input.shape(), input.device());
  launch(input.device(), input.numel(),
         kernels::DropoutForward{output_.data(), mask_.data(), input.data(), p_, seed_, counter_});
  counter_ += static_cast<uint64_t>(input.numel());
  return output_;
}

Tensor Dropout::backward(const Tensor& grad_output, bool need_input_grad) {
  if (!need_input_grad) return {};
  if (!masked_) return grad_output;
  ensure_tensor(grad_input_, grad_output.shape(), grad_output.device());
  launch(grad_output.device(), grad_output.numel(),
         kernels::Multiply{grad_input_.data(), grad_output.data(), mask_.data()});
  return grad_input_;
}

std::string Dropout::describe() const { return fmt::format("Dropout(p={})", p_); }

}  // namespace dtrain
