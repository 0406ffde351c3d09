// The CUDA side of launch() (core/launch.h): a grid-stride kernel that runs f(i) for i < n on
// the compute stream. Each functor type is registered once, in a .cu file of the GPU backend
// library, at global namespace scope with the fully qualified type:
//   #include "core/cuda/launch.cuh"
//   DTRAIN_REGISTER_KERNEL(dtrain::kernels::Fill)
// which instantiates the kernel and records it under the functor's type when the library loads;
// launch() in plain C++ files then reaches it through GpuBackend::launch (core/gpu_backend.h),
// so they launch GPU kernels without being compiled by nvcc or linked against CUDA.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <typeinfo>

#include <cuda_runtime.h>

#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_stream.h"
#include "core/cuda/kernel_registry.h"
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

template <class F>
void launch_erased(int64_t n, const void* functor) {
  launch(n, *static_cast<const F*>(functor));
}

// The lanes of a row kernel on CUDA (Note [Row launches] in core/launch.h): the 32 threads of a
// warp. sum and max are butterflies (xor shuffles): every lane ends with the same value, reached
// in the same order on every run.
struct WarpLanes {
  int lane_;
  __device__ int lane() const { return lane_; }
  __device__ static constexpr int count() { return 32; }
  __device__ float sum(float v) const {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
  }
  __device__ float max(float v) const {
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float other = __shfl_xor_sync(0xffffffffu, v, offset);
      v = other > v ? other : v;
    }
    return v;
  }
};

namespace detail {

inline constexpr int kRowsPerBlock = kLaunchThreads / 32;

// A warp per row, grid-stride over rows; every lane of a warp walks the same rows, so the
// shuffles always see all 32 lanes.
template <class F>
__global__ void __launch_bounds__(kLaunchThreads) row_kernel(int64_t rows, F f) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
  const WarpLanes lanes{static_cast<int>(threadIdx.x % 32)};
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32; r < rows; r += stride)
    f(lanes, r);
}

}  // namespace detail

template <class F>
void launch_rows_erased(int64_t rows, const void* functor) {
  if (rows <= 0) return;
  const int64_t blocks = std::min((rows + detail::kRowsPerBlock - 1) / detail::kRowsPerBlock, detail::kMaxLaunchBlocks);
  detail::row_kernel<F><<<static_cast<unsigned>(blocks), detail::kLaunchThreads, 0, compute_stream_handle()>>>(
      rows, *static_cast<const F*>(functor));
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace dtrain::cuda

#define DTRAIN_KERNEL_CONCAT_(a, b) a##b
#define DTRAIN_KERNEL_CONCAT(a, b) DTRAIN_KERNEL_CONCAT_(a, b)
// Instantiates the CUDA launch of functor type F and registers it when the library loads.
#define DTRAIN_REGISTER_KERNEL(F)                                                   \
  [[maybe_unused]] static const bool DTRAIN_KERNEL_CONCAT(dtrain_kernel_registered_, __COUNTER__) = \
      ::dtrain::cuda::register_kernel(typeid(F), &::dtrain::cuda::launch_erased<F>);
// The same for a row kernel (launch_rows, Note [Row launches]): registered under RowsOf<F>.
#define DTRAIN_REGISTER_ROW_KERNEL(F)                                                \
  [[maybe_unused]] static const bool DTRAIN_KERNEL_CONCAT(dtrain_kernel_registered_, __COUNTER__) = \
      ::dtrain::cuda::register_kernel(typeid(::dtrain::RowsOf<F>), &::dtrain::cuda::launch_rows_erased<F>);
