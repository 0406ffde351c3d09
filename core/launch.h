// launch(device, n, f): runs f(i) for i in [0, n) on the device. Kernels are written once as
// functors with DTRAIN_HD bodies (see core/kernels.h, model/kernels.h); on CPU they run in a
// plain loop, on CUDA in a grid-stride kernel on the compute stream, which the GPU backend
// library instantiated for the functor's type (core/gpu_backend.h). Only this dispatch differs
// between the paths, so the CPU tests exercise the GPU's arithmetic.
#pragma once

#include <cstdint>
#include <type_traits>
#include <typeinfo>

#include "core/device.h"
#include "core/error.h"

#if defined(__CUDACC__)
#define DTRAIN_HD __host__ __device__
#else
#define DTRAIN_HD
#endif

namespace dtrain {

// The CUDA side (core/gpu_backend.cpp): the backend runs the kernel registered for `kernel`.
void launch_on_gpu(const std::type_info& kernel, int64_t n, const void* functor);

template <class F>
void launch(Device device, int64_t n, const F& f) {
  if (n <= 0) return;
  if (device.is_cpu()) {
    // Iterations are independent by contract (the GPU runs them all at once), which the
    // compiler cannot prove through the functor's pointers: ivdep lets it vectorise. The local
    // copy keeps the functor's fields out of reach of those pointers' stores.
    const F local = f;
#pragma GCC ivdep
    for (int64_t i = 0; i < n; ++i) local(i);
    return;
  }
  static_assert(std::is_trivially_copyable_v<F>, "kernel functors are passed by value to the GPU");
  launch_on_gpu(typeid(F), n, &f);
}

}  // namespace dtrain
