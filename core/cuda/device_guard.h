// DeviceGuard: makes `device` current for a scope and restores the previous one, for the
// few calls that act on the current device (cudaMalloc, cudaEventCreate, handle creation).
// Internal to core/cuda (includes CUDA headers).
#pragma once

#include <cuda_runtime.h>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_check.h"

namespace dtrain::cuda {

// Per-device singletons (compute streams, cuBLAS handles) live in fixed tables of this size.
inline constexpr int kMaxDevices = 64;

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    // A thread that never chose a device adopts the process's first: otherwise "previous" is
    // device 0 and restoring it would create a context on someone else's GPU.
    previous_ = current_device();
    if (previous_ == device) {
      previous_ = -1;
    } else {
      CUDA_CHECK(cudaSetDevice(device));
    }
  }
  ~DeviceGuard() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);  // best effort: destructors must not throw
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace dtrain::cuda
