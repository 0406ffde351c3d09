// BatchNorm2d / BatchNorm1d (PyTorch's, affine, track_running_stats) and global average pooling.
// Training normalises with the batch's statistics and updates the running ones; evaluation
// normalises with the running ones. The arithmetic: Note [BatchNorm arithmetic] in
// model/norm_kernels.h.
#pragma once

#include "model/module.h"

namespace dtrain {

struct BatchNormOptions {
  float eps = 1e-5f;
  float momentum = 0.1f;  // running = momentum * batch + (1 - momentum) * running
};

class BatchNorm : public Module {
 public:
  // dims 2: BatchNorm2d over [N, C, H, W]; dims 1: BatchNorm1d over [N, C] or [N, C, L].
  // weight 1, bias 0, running_mean 0, running_var 1, num_batches_tracked 0 (int64), as PyTorch.
  BatchNorm(int64_t channels, int dims, Device device, BatchNormOptions options = {});
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, bool need_input_grad = true) override;
  std::vector<Parameter*> parameters() override { return {&weight_, &bias_}; }
  std::vector<Buffer*> buffers() override { return {&running_mean_, &running_var_, &num_batches_tracked_}; }
  std::string describe() const override;
  bool absorb_following_relu() override { return relu_ = true; }

 private:
  // [N, C, plane] of the input, checked against the layer's kind and channels.
  void check_input(const Tensor& input);

  int64_t channels_;
  int dims_;
  BatchNormOptions options_;
  bool relu_ = false;  // output is ReLU(bn(x)): Note [Fused ReLU]
  Parameter weight_, bias_;
  Buffer running_mean_, running_var_, num_batches_tracked_;
  int64_t batch_ = 0, plane_ = 0;
  bool trained_forward_ = false;  // the last forward used the batch's statistics
  Tensor input_, output_, grad_input_;
  Tensor stats_;  // [7, C]: mean, invstd, alpha, shift, grad_mean, k, scale (norm_kernels.h)
};

// adaptive_avg_pool2d(x, 1) then flatten: [N, C, H, W] -> [N, C].
class GlobalAvgPool : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, bool need_input_grad = true) override;
  std::string describe() const override { return "GlobalAvgPool()"; }

 private:
  Shape input_shape_;
  Tensor output_, grad_input_;
};

}  // namespace dtrain
