// launch(device, n, f): runs f(i) for i in [0, n) on the device. Kernels are written once as
// functors with DTRAIN_HD bodies (see core/kernels.h, model/kernels.h); the CPU build runs
// them in a plain loop, the CUDA build in a grid-stride kernel on the compute stream. Only
// this dispatch differs between the paths, so the CPU tests exercise the GPU's arithmetic.
#pragma once

#include <cstdint>

#include "core/device.h"
#include "core/error.h"

#if defined(__CUDACC__)
#define DTRAIN_HD __host__ __device__
#else
#define DTRAIN_HD
#endif

namespace dtrain {

#ifdef DTRAIN_WITH_CUDA
namespace cuda {
// Defined in core/cuda/launch.cuh and explicitly instantiated, once per functor, in a .cu file
// (DTRAIN_INSTANTIATE_LAUNCH); a missing instantiation is a link error in the CUDA build.
template <class F>
void launch(int64_t n, const F& f);
}  // namespace cuda
#endif

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
#ifdef DTRAIN_WITH_CUDA
  cuda::launch(n, f);
#else
  throw Error("this dtrain binary was built without CUDA");
#endif
}

}  // namespace dtrain
