// The GPU kernels of the backend library by functor type: DTRAIN_REGISTER_KERNEL (launch.cuh)
// records each .cu file's instantiations here when the library loads, and GpuBackend::launch
// finds them. Plain C++ (no CUDA headers), so .cpp files of the library can use it.
#pragma once

#include <cstdint>
#include <typeinfo>

namespace dtrain::cuda {

// A launch with its functor type erased, as the registry keeps it.
using ErasedLaunch = void (*)(int64_t n, const void* functor);

// Records `launch` as the kernel for functor type `kernel`; returns true.
bool register_kernel(const std::type_info& kernel, ErasedLaunch launch);
// Runs the kernel registered for `kernel`; throws Error naming the type when there is none.
void launch_registered(const std::type_info& kernel, int64_t n, const void* functor);

}  // namespace dtrain::cuda
