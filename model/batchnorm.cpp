#include "model/batchnorm.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/ops.h"
#include "model/cpu_norm.h"
#include "model/norm_kernels.h"

namespace dtrain {

namespace {

// Rows of BatchNorm's per-channel scratch (stats_).
// sum_dy and sum_dy_xmu are adjacent: SyncBatchNorm all-reduces them as one; the backward
// coefficients then overwrite them (grad_mean, k).
enum StatRow { kMean, kInvstd, kAlpha, kShift, kSumDy, kSumDyXmu, kScale, kCount, kStatRows };

}  // namespace

BatchNorm::BatchNorm(int64_t channels, int dims, Device device, BatchNormOptions options)
    : channels_(channels), dims_(dims), options_(options) {
  DTRAIN_CHECK(channels > 0 && (dims == 1 || dims == 2), "BatchNorm{}d({})", dims, channels);
  weight_ = {"weight", Tensor::empty({channels}, device), Tensor::zeros({channels}, device)};
  bias_ = {"bias", Tensor::zeros({channels}, device), Tensor::zeros({channels}, device)};
  fill(weight_.value, 1.f);
  running_mean_ = {"running_mean", Tensor::zeros({channels}, device)};
  running_var_ = {"running_var", Tensor::empty({channels}, device)};
  fill(running_var_.value, 1.f);
  num_batches_tracked_ = {"num_batches_tracked", Tensor::zeros({}, device, DType::kI64)};
  stats_ = Tensor::zeros({kStatRows, channels}, device);
}

void BatchNorm::check_input(const Tensor& input) {
  const bool fits = dims_ == 2 ? input.ndim() == 4 : (input.ndim() == 2 || input.ndim() == 3);
  DTRAIN_CHECK(fits && input.dim(1) == channels_, "{} expects [N, {}{}], got {}", describe(), channels_,
               dims_ == 2 ? ", H, W" : "(, L)", shape_str(input.shape()));
  batch_ = input.dim(0);
  plane_ = input.numel() / std::max<int64_t>(1, batch_ * channels_);
}

// Per call: one per-channel pass (statistics, or the running ones' coefficients in evaluation),
// one elementwise pass; in training the num_batches_tracked increment.
Tensor BatchNorm::forward(const Tensor& input) { return forward_impl(input, nullptr); }

Tensor BatchNorm::forward_add_relu(const Tensor& input, const Tensor& residual) {
  DTRAIN_CHECK(!relu_, "{}: forward_add_relu with a fused ReLU of its own", describe());
  DTRAIN_CHECK(residual.shape() == input.shape() && residual.device() == input.device(),
               "{}: residual {} for input {}", describe(), shape_str(residual.shape()), shape_str(input.shape()));
  return forward_impl(input, &residual);
}

Tensor BatchNorm::forward_impl(const Tensor& input, const Tensor* residual) {
  check_input(input);
  const Device dev = weight_.value.device();
  input_ = input;
  ensure_tensor(output_, input.shape(), dev);
  float* s = stats_.data();
  const int64_t c = channels_;
  trained_forward_ = training();
  if (trained_forward_) {
    batch_statistics(input);
    launch(dev, 1, kernels::IncrementCounter{num_batches_tracked_.value.data_as<int64_t>()});
  } else {
    launch(dev, c,
           kernels::BatchNormEvalCoefficients{s + kAlpha * c, s + kShift * c, running_mean_.value.data(),
                                              running_var_.value.data(), weight_.value.data(), bias_.value.data(),
                                              options_.eps});
  }
  // One thread per element on the GPU; per plane on the CPU (the same floats, a vectorised loop).
  const kernels::BatchNormApplyPlanes apply{output_.data(), input.data(), s + kAlpha * c, s + kShift * c, c, plane_,
                                            relu_ || residual != nullptr, residual ? residual->data() : nullptr};
  if (dev.is_cpu())
    launch(dev, batch_ * c, apply);
  else
    launch(dev, output_.numel(), kernels::BatchNormApply{apply});
  return output_;
}

// The per-channel statistics: the row kernel on a GPU, its CPU lane's loops vectorised (bitwise).
void BatchNorm::stats(const kernels::BatchNormStats& k) {
  if (weight_.value.device().is_cpu())
    cpu::batchnorm_stats(k);
  else
    launch_rows(weight_.value.device(), channels_, k);
}

void BatchNorm::batch_statistics(const Tensor& input) {
  const Device dev = weight_.value.device();
  float* s = stats_.data();
  const int64_t c = channels_;
  if (!sync_) {
    // PyTorch refuses this too: one value per channel has no variance.
    DTRAIN_CHECK(batch_ * plane_ > 1, "{} in training needs more than one value per channel, got input {}",
                 describe(), shape_str(input.shape()));
    stats(kernels::BatchNormStats{s + kMean * c, s + kInvstd * c, s + kAlpha * c, s + kShift * c,
                                  running_mean_.value.data(), running_var_.value.data(), input.data(),
                                  weight_.value.data(), bias_.value.data(), batch_, c, plane_, options_.eps,
                                  options_.momentum});
    return;
  }
  // Note [SyncBatchNorm]: this rank's [mean, invstd, mean remainder, variance, its remainder,
  // count], every rank's, combined (Note [SyncBatchNorm statistics] in model/norm_kernels.h).
  ensure_tensor(local_, {5 * c + 1}, dev);
  ensure_tensor(gathered_, {sync_->ranks(), 5 * c + 1}, dev);
  float* l = local_.data();
  if (batch_ > 0)
    stats(kernels::BatchNormStats{l, l + c, s + kAlpha * c, s + kShift * c, nullptr, nullptr, input.data(),
                                  weight_.value.data(), bias_.value.data(), batch_, c, plane_, options_.eps,
                                  options_.momentum, l + 2 * c});
  launch(dev, 1, kernels::SetValue{l + 5 * c, static_cast<float>(batch_ * plane_)});
  sync_->allgather(local_, gathered_);
  launch(dev, c,
         kernels::BatchNormCombineStats{s + kMean * c, s + kInvstd * c, s + kAlpha * c, s + kShift * c,
                                        s + kCount * c, running_mean_.value.data(), running_var_.value.data(),
                                        gathered_.data(), weight_.value.data(), bias_.value.data(), sync_->ranks(), c,
                                        options_.eps, options_.momentum});
}

Tensor BatchNorm::backward(const Tensor& grad_output, bool need_input_grad) {
  DTRAIN_CHECK(trained_forward_, "{} backward after a forward in evaluation mode", describe());
  DTRAIN_CHECK(grad_output.numel() == output_.numel(), "{} backward got {}", describe(),
               shape_str(grad_output.shape()));
  const Device dev = weight_.value.device();
  float* s = stats_.data();
  const int64_t c = channels_;
  // The fused ReLU's mask from the input and forward's alpha, shift (Note [ReLU mask from the input]).
  const kernels::ReluMask mask = relu_ ? kernels::ReluMask{s + kAlpha * c, s + kShift * c} : kernels::ReluMask{};
  const float weight_beta = take_grad_beta(weight_), bias_beta = take_grad_beta(bias_);
  const kernels::BatchNormBackwardReduce reduce{weight_.grad.data(), bias_.grad.data(), s + kSumDy * c,
                                                s + kSumDyXmu * c, grad_output.data(), mask, input_.data(),
                                                s + kMean * c, s + kInvstd * c, batch_, c, plane_, weight_beta,
                                                bias_beta};
  if (dev.is_cpu())
    cpu::batchnorm_backward_reduce(reduce);  // the row kernel's CPU lane, vectorised (bitwise)
  else
    launch_rows(dev, c, reduce);
  grad_ready(weight_);
  grad_ready(bias_);
  if (!need_input_grad) return {};  // SyncBatchNorm too: every rank skips alike (the same model)
  if (sync_) {
    Tensor sums = stats_.slice(kSumDy * c, {2 * c});
    sync_->allreduce_sum(sums);
  }
  // grad_mean and k overwrite the sums they are computed from (per channel, in place).
  launch(dev, c,
         kernels::BatchNormBackwardCoefficients{s + kSumDy * c, s + kSumDyXmu * c, s + kScale * c, s + kSumDy * c,
                                                s + kSumDyXmu * c, s + kInvstd * c, weight_.value.data(),
                                                sync_ ? s + kCount * c : nullptr,
                                                static_cast<double>(batch_ * plane_)});
  ensure_tensor(grad_input_, input_.shape(), dev);
  if (dev.is_cpu())
    launch(dev, batch_ * c,
           kernels::BatchNormBackwardInputPlanes{grad_input_.data(), grad_output.data(), mask, input_.data(),
                                                 s + kMean * c, s + kSumDy * c, s + kSumDyXmu * c, s + kScale * c, c,
                                                 plane_});
  else
    launch(dev, grad_input_.numel(),
           kernels::BatchNormBackwardInput{{grad_input_.data(), grad_output.data(), mask, input_.data(), s + kMean * c,
                                            s + kSumDy * c, s + kSumDyXmu * c, s + kScale * c, c, plane_}});
  return grad_input_;
}

std::string BatchNorm::describe() const { return fmt::format("BatchNorm{}d({})", dims_, channels_); }

Tensor GlobalAvgPool::forward(const Tensor& input) {
  DTRAIN_CHECK(input.ndim() == 4, "GlobalAvgPool expects [N, C, H, W], got {}", shape_str(input.shape()));
  input_shape_ = input.shape();
  ensure_tensor(output_, {input.dim(0), input.dim(1)}, input.device());
  launch(input.device(), output_.numel(),
         kernels::GlobalAvgPoolForward{output_.data(), input.data(), input.dim(2) * input.dim(3)});
  return output_;
}

Tensor GlobalAvgPool::backward(const Tensor& grad_output, bool need_input_grad) {
  if (!need_input_grad) return {};
  DTRAIN_CHECK(grad_output.numel() == output_.numel(), "GlobalAvgPool backward got {}",
               shape_str(grad_output.shape()));
  const Device dev = grad_output.device();
  ensure_tensor(grad_input_, input_shape_, dev);
  const int64_t plane = input_shape_[2] * input_shape_[3];
  if (dev.is_cpu())
    launch(dev, grad_output.numel(),
           kernels::GlobalAvgPoolBackwardPlanes{grad_input_.data(), grad_output.data(), plane});
  else
    launch(dev, grad_input_.numel(), kernels::GlobalAvgPoolBackward{grad_input_.data(), grad_output.data(), plane});
  return grad_input_;
}

}  // namespace dtrain
