// Kernels for the stream/event ordering tests (see stream_kernels.h).
#include "tests/gpu/stream_kernels.h"

#include <cuda_runtime.h>

#include "core/cuda/cuda_check.h"

namespace dtrain::testing {

namespace {

__global__ void spin_then_store_kernel(int* flag, int value, long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  *flag = value;
}

__global__ void copy_int_kernel(int* dst, const int* src) { *dst = *src; }

}  // namespace

void spin_then_store(void* stream, int* flag, int value, int64_t cycles) {
  spin_then_store_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(flag, value, static_cast<long long>(cycles));
  CUDA_CHECK(cudaGetLastError());
}

void copy_int(void* stream, int* dst, const int* src) {
  copy_int_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(dst, src);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace dtrain::testing
