// Kernels of loss scaling (model/grad_scaler.h), device-generic functors (core/launch.h); CUDA
// instantiations in model/cuda/grad_scaler_kernels.cu.
#pragma once

#include <cstdint>

#include "core/kernels.h"
#include "core/launch.h"

namespace dtrain::kernels {

// One thread per chunk c of `chunks` (strided as SumSquaresStrided): g[i] *= inv_scale for i = c,
// c + chunks, ... < n, and bad[c] = 1 when one of those g[i] was an infinity or a NaN before the
// multiply (PyTorch's _amp_foreach_non_finite_check_and_unscale_ checks the scaled value), else
// 0. One writer per flag: no race on the CPU threads, and the same flags on every device.
struct UnscaleCheckStrided {
  float* bad;  // [chunks]
  float* g;    // [n]
  int64_t n, chunks;
  float inv_scale;
  DTRAIN_HD void operator()(int64_t c) const {
    float found = 0.f;
    for (int64_t i = c; i < n; i += chunks) {
      const float v = g[i];
      if ((float_bits(v) & 0x7f800000u) == 0x7f800000u) found = 1.f;  // all-ones exponent: inf or NaN
      g[i] = v * inv_scale;
    }
    bad[c] = found;
  }
};

// One thread: out[0] = sum of partial[0, count) in double, in order (the chunk flags' group sums
// from SumGroups): the number of chunks that held an infinity or a NaN.
struct SumToOne {
  float* out;  // [1]
  const float* partial;
  int64_t count;
  DTRAIN_HD void operator()(int64_t) const {
    double total = 0;
    for (int64_t i = 0; i < count; ++i) total += partial[i];
    out[0] = static_cast<float>(total);
  }
};

}  // namespace dtrain::kernels
