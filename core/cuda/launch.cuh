// The CUDA side of launch() (core/launch.h): a grid-stride kernel that runs f(i) for i < n on
// the compute stream. launch() is declared in core/launch.h for CPU translation units and
// defined here; each functor gets one explicit instantiation in a .cu file, written at global
// namespace scope with the fully qualified type (C++ allows an explicit instantiation only in
// a namespace enclosing the template, so not inside namespace dtrain::kernels):
//   #include "core/cuda/launch.cuh"
//   DTRAIN_INSTANTIATE_LAUNCH(dtrain::kernels::Fill)
// so plain C++ files can launch GPU kernels without being compiled by nvcc.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_stream.h"
#include "core/launch.h"

namespace dtrain::cuda {

namespace detail {

inline constexpr int kLaunchThreads = 256;
// Enough blocks to fill any current GPU many times over (H100: 132 SMs x 8 blocks of 256);
// larger n loops inside the kernel instead of growing the grid.
inline constexpr int64_t kMaxLaunchBlocks = int64_t{65535} * 4;

template <class F>
__global__ void __launch_bounds__(kLaunchThreads) grid_stride_kernel(int64_t n, F f) {
  // 64-bit indices throughout: n may exceed 2^31, and blockIdx.x * blockDim.x may overflow int.
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) f(i);
}

}  // namespace detail

template <class F>
void launch(int64_t n, const F& f) {
  static_assert(std::is_trivially_copyable_v<F>, "kernel functors are passed by value to the GPU");
  if (n <= 0) return;
  const int64_t blocks = std::min((n + detail::kLaunchThreads - 1) / detail::kLaunchThreads, detail::kMaxLaunchBlocks);
  detail::grid_stride_kernel<F>
      <<<static_cast<unsigned>(blocks), detail::kLaunchThreads, 0, compute_stream_handle()>>>(n, f);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace dtrain::cuda

// Explicit instantiation of dtrain::cuda::launch for functor type F (at global namespace scope).
#define DTRAIN_INSTANTIATE_LAUNCH(F) template void dtrain::cuda::launch<F>(int64_t, const F&);
