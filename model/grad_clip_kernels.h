// Kernels of gradient clipping by the global norm (model/grad_clip.h), device-generic functors
// (core/launch.h); CUDA instantiations in model/cuda/grad_clip_kernels.cu.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/launch.h"

namespace dtrain::kernels {

// One thread per chunk c of `chunks`: partial[c] = sum of g[i]^2 over i = c, c + chunks, ... < n.
// Strided so that neighbouring GPU threads read neighbouring floats; a fixed chunk count and a
// fixed order per chunk give the same bits on every device and thread count.
struct SumSquaresStrided {
  float* partial;  // [chunks]
  const float* g;  // [n]
  int64_t n, chunks;
  DTRAIN_HD void operator()(int64_t c) const {
    float s = 0.f;
    for (int64_t i = c; i < n; i += chunks) s += g[i] * g[i];
    partial[c] = s;
  }
};

// SumSquaresStrided over many spans of one buffer in one launch: one thread per chunk c of all
// spans together (span s has the chunks [first[s], first[s+1]), found by binary search), summing
// what SumSquaresStrided would for that span's chunk, in the same order: the same bits as one
// launch per span. The flat store's gradient with one span per parameter: one launch per clip.
struct SumSquaresSpans {
  float* partial;         // [first[spans]]
  const float* base;
  const int64_t* offset;  // [spans]: span s starts at base + offset[s]
  const int64_t* count;   // [spans]: its floats
  const int64_t* first;   // [spans + 1]: its first chunk, ascending
  int64_t spans;
  DTRAIN_HD void operator()(int64_t c) const {
    int64_t lo = 0, hi = spans - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (first[mid] <= c) lo = mid; else hi = mid - 1;
    }
    const int64_t chunks = first[lo + 1] - first[lo], n = count[lo];
    const float* g = base + offset[lo];
    float s = 0.f;
    for (int64_t i = c - first[lo]; i < n; i += chunks) s += g[i] * g[i];
    partial[c] = s;
  }
};

// Partials per group of the second stage: the total of a GPT-2 small's ~121k chunk sums is 119
// group sums in parallel, then 119 serial adds, instead of 121k serial adds on one GPU thread.
inline constexpr int64_t kNormGroup = 1024;

// One thread per group g: sums[g] = partial[g*kNormGroup, min(count, (g+1)*kNormGroup)) added
// in double, in index order, rounded to float once. Fixed groups and a fixed order: the same
// bits on every device.
struct SumGroups {
  float* sums;  // [ceil(count / kNormGroup)]
  const float* partial;  // [count]
  int64_t count;
  DTRAIN_HD void operator()(int64_t g) const {
    const int64_t end = (g + 1) * kNormGroup < count ? (g + 1) * kNormGroup : count;
    double s = 0;
    for (int64_t i = g * kNormGroup; i < end; ++i) s += partial[i];
    sums[g] = static_cast<float>(s);
  }
};

// One thread: out[0] = sqrt(sum of partial[0, count)), the global L2 norm; out[1] = the clip
// coefficient min(1, max_norm / (norm + 1e-6)) as torch.nn.utils.clip_grad_norm_ computes it
// in float (1 when max_norm is 0: no clipping). The partials (SumGroups' group sums) are summed
// in double, in order.
struct GlobalNormAndClipCoefficient {
  float* out;  // [2]
  const float* partial;
  int64_t count;
  float max_norm;
  DTRAIN_HD void operator()(int64_t) const {
    double total = 0;
    for (int64_t i = 0; i < count; ++i) total += partial[i];
    const float norm = static_cast<float>(sqrt(total));
    const float coef = max_norm / (norm + 1e-6f);
    out[0] = norm;
    out[1] = max_norm > 0.f && coef < 1.f ? coef : 1.f;
  }
};

}  // namespace dtrain::kernels
