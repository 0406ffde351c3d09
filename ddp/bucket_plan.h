// The bucket plan: which parameters' gradients share a bucket. A pure function, as PyTorch's
// compute_bucket_assignment_by_size: walk the parameters in the order backward produces their
// gradients (at first assumed to be reverse parameter order; after the first step, the order
// rank 0 observed: Note [Rebuilding buckets] in ddp/reducer.h), add each to the open bucket, and
// close the bucket once it holds at least its cap. The first bucket's cap is small (1 MiB) so
// the first all-reduce starts early.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain {

inline constexpr size_t kDefaultFirstBucketBytes = 1u << 20;   // 1 MiB, as PyTorch
inline constexpr size_t kDefaultBucketCapBytes = 25u << 20;    // 25 MiB, as PyTorch

// Returns parameter indices per bucket, bucket 0 first (it fills first during backward).
// Within a bucket the indices are in reverse parameter order. Every index appears once.
std::vector<std::vector<size_t>> compute_bucket_plan(const std::vector<size_t>& param_bytes,
                                                     size_t first_bucket_bytes = kDefaultFirstBucketBytes,
                                                     size_t bucket_cap_bytes = kDefaultBucketCapBytes);

// The same over parameters taken in `ready_order` (a permutation of 0..n-1: the order their
// gradients became ready); within a bucket the indices keep that order.
std::vector<std::vector<size_t>> compute_bucket_plan(const std::vector<size_t>& param_bytes,
                                                     const std::vector<size_t>& ready_order,
                                                     size_t first_bucket_bytes, size_t bucket_cap_bytes);

// Everything that decides the buckets: the order gradients become ready and the two caps. Made
// once per run (after the first step; with --bucket-cap-mb auto after the trial steps too) and
// saved in checkpoints, so that a resumed run reduces through the same buckets.
struct BucketLayout {
  std::vector<size_t> ready_order;  // parameter indices
  size_t first_bucket_bytes = kDefaultFirstBucketBytes;
  size_t bucket_cap_bytes = kDefaultBucketCapBytes;
  bool operator==(const BucketLayout&) const = default;
};

// n-1, ..., 1, 0: the order a chain of layers produces gradients in.
std::vector<size_t> reverse_parameter_order(size_t n);

// Empty when `order` is a permutation of 0..n-1, else what is wrong with it (for the errors of
// a checkpoint or a broadcast that does not fit the model).
std::string check_ready_order(const std::vector<size_t>& order, size_t n);

// "2 buckets: 4.2 MiB, 3.1 MiB" (for logs).
std::string describe_plan(const std::vector<std::vector<size_t>>& plan, const std::vector<size_t>& param_bytes);

}  // namespace dtrain
