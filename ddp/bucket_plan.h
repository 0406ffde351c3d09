// The bucket plan: which parameters' gradients share a bucket. A pure function, as PyTorch's
// compute_bucket_assignment_by_size: walk the parameters in reverse order (the order backward
// produces their gradients), add each to the open bucket, and close the bucket once it holds
// at least its cap. The first bucket's cap is small (1 MiB) so the first all-reduce starts early.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dtrain {

inline constexpr size_t kDefaultFirstBucketBytes = 1u << 20;   // 1 MiB, as PyTorch
inline constexpr size_t kDefaultBucketCapBytes = 25u << 20;    // 25 MiB, as PyTorch

// Returns parameter indices per bucket, bucket 0 first (it fills first during backward).
// Within a bucket the indices are in reverse parameter order. Every index appears once.
std::vector<std::vector<size_t>> compute_bucket_plan(const std::vector<size_t>& param_bytes,
                                                     size_t first_bucket_bytes = kDefaultFirstBucketBytes,
                                                     size_t bucket_cap_bytes = kDefaultBucketCapBytes);

}  // namespace dtrain
