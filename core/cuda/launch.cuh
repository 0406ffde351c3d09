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

}  // namespace dtrain::cuda

#define DTRAIN_KERNEL_CONCAT_(a, b) a##b
#define DTRAIN_KERNEL_CONCAT(a, b) DTRAIN_KERNEL_CONCAT_(a, b)
// Instantiates the CUDA launch of functor type F and registers it when the library loads.
#define DTRAIN_REGISTER_KERNEL(F)                                                   \
  [[maybe_unused]] static const bool DTRAIN_KERNEL_CONCAT(dtrain_kernel_registered_, __COUNTER__) = \
      ::dtrain::cuda::register_kernel(typeid(F), &::dtrain::cuda::launch_erased<F>);
