// Gradient clipping by the global L2 norm, as torch.nn.utils.clip_grad_norm_(params, max_norm):
// the norm of all gradients together, then every gradient scaled by min(1, max_norm / (norm +
// 1e-6)). Everything stays on the parameters' device (a chunked sum of squares, the chunk sums
// added in groups of 1024, a one-thread total of the groups, a scale that reads the coefficient
// from device memory): no host round trip per step.
// Run it after the gradient all-reduce, so every rank holds the same gradients, computes the
// same bits and takes the same decision. No MPI here. Under ZeRO-2 (FlatStore::grads_sharded;
// Note [ZeRO-2 gradient ring] in ddp/reducer.h) a rank holds only its chunks of the reduced gradient: the
// norm is then its chunks' sum of squares added over the ranks by `sum_over_ranks` (one
// all-reduce of a scalar, through the host), so every rank takes the same decision; within
// rounding of the whole-gradient norm (another order of sums), not bitwise. `copies` are left
// out of the sharded sum too (their owned elements cut from the spans).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/tensor.h"
#include "model/module.h"

namespace dtrain {

class GradNormClipper {
 public:
  // `sum_over_ranks`: a rank's sum of squares -> every rank's added (collective); needed when
  // the gradients are sharded (FlatStore::grads_sharded) and when `params_are_a_part`: the ranks
  // hold parts of the model (pipeline stages), whose sums of squares add up to the whole
  // model's. `copies`: parameters of `params` another rank's part counts (a tied weight's second
  // copy): scaled with the others, left out of the sum.
  explicit GradNormClipper(std::vector<Parameter*> params, std::function<float(float)> sum_over_ranks = nullptr,
                           bool params_are_a_part = false, std::vector<const Parameter*> copies = {});
  // Computes the global norm of the gradients written since zero_grad() (an absent gradient
  // counts as none, as PyTorch's None); with max_norm > 0 scales them by the coefficient.
  // Enqueued on the device; returns without waiting.
  void clip(float max_norm);
  // The norm of the last clip(), before clipping (a device-to-host copy: waits for it). For logs.
  float last_norm() const;
  // The device tensor [norm, coefficient] of the last clip().
  const Tensor& result() const { return result_; }

 private:
  void clip_owned(float max_norm);  // the sharded case
  // group_sums_[0, groups) summed into group_sums_[groups], then that added over the ranks.
  void add_parts_sums(int64_t groups);
  // Every parameter written and each a view of the store's flat gradient: one launch for the
  // sums of squares, one for the scaling (the gaps between parameters are zeros).
  bool flat_path() const;
  void upload_spans();  // span_table_ for the store's layout


  std::vector<Parameter*> params_;
  std::function<float(float)> sum_over_ranks_;
  bool part_ = false;
  std::vector<const Parameter*> copies_;
  std::vector<int64_t> first_partial_;  // per parameter: where its chunks' sums go
  std::vector<int64_t> chunks_;         // per parameter
  Tensor partials_;
  Tensor group_sums_;  // [ceil(partials / kernels::kNormGroup)]
  Tensor result_;
  Tensor span_table_;  // int64 offset[P], count[P], first[P + 1] on the device, as U8 bytes
  int64_t span_table_version_ = -1;
  int64_t launches_ = 0;

 public:
  // Kernel launches of all clip() calls so far (for tests).
  int64_t launches() const { return launches_; }
};

// Chunks of a gradient of n elements: about 1024 elements each (enough threads for a GPU; their
// sums are added in groups of kernels::kNormGroup, then the groups on one thread).
int64_t grad_norm_chunks(int64_t n);

}  // namespace dtrain
