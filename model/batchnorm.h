// BatchNorm2d / BatchNorm1d (PyTorch's, affine, track_running_stats) and global average pooling.
// Training normalises with the batch's statistics and updates the running ones; evaluation
// normalises with the running ones. The arithmetic: Note [BatchNorm arithmetic] in
// model/norm_kernels.h.
#pragma once

#include <memory>

#include "model/module.h"

namespace dtrain::kernels {
struct BatchNormStats;
}  // namespace dtrain::kernels

namespace dtrain {

// Note [SyncBatchNorm]: PyTorch's SyncBatchNorm, on any device. In training, each rank computes
// its batch's per-channel mean and inverse std, all-gathers [mean, invstd, count] from every
// rank (here also each mean's and variance's float remainder: Note [SyncBatchNorm statistics]
// in model/norm_kernels.h), and combines them (ranks with count 0 masked out;
// kernels::BatchNormCombineStats) into the statistics of all ranks' samples, which normalise and
// update the running statistics (the variance unbiased over the total count). Backward
// all-reduces the two per-channel sums (sum dy, sum (x - mean) dy) before the input gradient;
// the weight and bias gradients stay this rank's, which DDP then averages. So np N x batch B
// normalises as BatchNorm at np 1 x batch NB.
// Two collectives per layer and step, on the communicator the implementation (ddp/
// sync_batchnorm.h) holds, with its deadlines and flight recorder; every rank must run the same
// training forwards (a rank that runs none, as Join's joined ranks, would leave the others
// waiting: the CLI refuses --sync-bn with --sampler uneven).
class BatchStatsSync {
 public:
  virtual ~BatchStatsSync() = default;
  virtual int ranks() const = 0;
  // Collective: every rank's `mine` (written by kernels on its device's compute stream) into
  // `all`, rank r's at r * mine.numel(); on return the compute stream may read `all`.
  virtual void allgather(const Tensor& mine, Tensor& all) = 0;
  // Collective: `t` summed over the ranks, in place; the same ordering.
  virtual void allreduce_sum(Tensor& t) = 0;
};

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
  // ReLU(bn(input) + residual) in the normalising pass (Note [Fused residual join] in
  // model/resnet.cpp); backward is forward's (the join's ReLU is masked by the caller).
  Tensor forward_add_relu(const Tensor& input, const Tensor& residual);
  Tensor backward(const Tensor& grad_output, bool need_input_grad = true) override;
  std::vector<Parameter*> parameters() override { return {&weight_, &bias_}; }
  std::vector<Buffer*> buffers() override { return {&running_mean_, &running_var_, &num_batches_tracked_}; }
  std::string describe() const override;
  bool absorb_following_relu() override { return relu_ = true; }
  void set_batch_stats_sync(std::shared_ptr<BatchStatsSync> sync) override { sync_ = std::move(sync); }

 private:
  // forward, with the join's residual added and ReLU applied (residual defined) or not.
  Tensor forward_impl(const Tensor& input, const Tensor* residual);
  // The training statistics: this rank's, or every rank's (Note [SyncBatchNorm]).
  void batch_statistics(const Tensor& input);
  void stats(const kernels::BatchNormStats& k);
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
  Tensor stats_;  // [8, C]: mean, invstd, alpha, shift, sum_dy, sum_dy_xmu, scale, count (norm_kernels.h)
  std::shared_ptr<BatchStatsSync> sync_;
  // SyncBatchNorm: [mean, invstd, mean remainder, variance, its remainder (C each), count], all ranks'
  Tensor local_, gathered_;
};

// adaptive_avg_pool2d(x, 1) then flatten: [N, C, H, W] -> [N, C].
class GlobalAvgPool : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  // ReLU(bn(input) + residual) in the normalising pass (Note [Fused residual join] in
  // model/resnet.cpp); backward is forward's (the join's ReLU is masked by the caller).
  Tensor forward_add_relu(const Tensor& input, const Tensor& residual);
  Tensor backward(const Tensor& grad_output, bool need_input_grad = true) override;
  std::string describe() const override { return "GlobalAvgPool()"; }

 private:
  Shape input_shape_;
  Tensor output_, grad_input_;
};

}  // namespace dtrain
