// Kernels for the stream/event ordering tests (see stream_kernels.h).
#include "tests/gpu/stream_kernels.h"

#include <algorithm>
#include <cstdint>

#include <cuda_runtime.h>

#include "core/cuda/cuda_check.h"
#include "core/kernels.h"

namespace dtrain::testing {

namespace {

__global__ void spin_then_store_kernel(int* flag, int value, long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  *flag = value;
}

__global__ void copy_int_kernel(int* dst, const int* src) { *dst = *src; }

__global__ void spin_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

__global__ void double_kernel(void* buf, long long count, Values values) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    if (values == Values::kF32) {
      static_cast<float*>(buf)[i] *= 2.f;
    } else {
      uint16_t& w = static_cast<uint16_t*>(buf)[i];
      w = values == Values::kBF16 ? kernels::float_to_bf16(2.f * kernels::bf16_to_float(w))
                                  : kernels::float_to_fp16(2.f * kernels::fp16_to_float(w));
    }
  }
}

}  // namespace

void spin_then_store(void* stream, int* flag, int value, int64_t cycles) {
  spin_then_store_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(flag, value, static_cast<long long>(cycles));
  CUDA_CHECK(cudaGetLastError());
}

void copy_int(void* stream, int* dst, const int* src) {
  copy_int_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(dst, src);
  CUDA_CHECK(cudaGetLastError());
}

void spin(void* stream, int64_t cycles) {
  spin_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<long long>(cycles));
  CUDA_CHECK(cudaGetLastError());
}

void spin_then_double(void* stream, void* buf, int64_t count, Values values, int64_t cycles) {
  spin(stream, cycles);
  if (count == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((count + threads - 1) / threads, 1024));
  double_kernel<<<blocks, threads, 0, s>>>(buf, static_cast<long long>(count), values);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace dtrain::testing
