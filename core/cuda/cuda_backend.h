// The CUDA runtime as the rest of dtrain sees it: plain C++ declarations (no CUDA headers),
// so CPU translation units can call into the GPU path when DTRAIN_WITH_CUDA is defined.
// Implemented in core/cuda/*.cu / *.cpp, compiled only in CUDA builds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/stream.h"

namespace dtrain::cuda {

// Number of visible devices; 0 when there is no driver or no device (never throws).
int device_count();
// Pins this process to logical device `index` (an index into CUDA_VISIBLE_DEVICES).
void set_device(int index);
// "0000:3b:00.0" for logical device `index`.
std::string pci_bus_id(int index);

// Caching allocator (cudaMalloc only, never managed memory).
void* alloc(size_t bytes, int device);
void free(void* ptr, size_t bytes, int device);
// Stream-ordered on the compute stream; returns once the copy is complete.
void copy(void* dst, bool dst_on_device, const void* src, bool src_on_device, size_t bytes);
void zero(void* dst, size_t bytes);
// Waits for all work on the compute stream.
void synchronize();

}  // namespace dtrain::cuda

namespace dtrain::cuda {

// Row-major GEMM through cuBLAS on the compute stream (see core/ops.h for the contract).
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void set_allow_tf32(bool allow);

}  // namespace dtrain::cuda

namespace dtrain::cuda {

// The process's compute stream (created on first use, on the current device).
Stream& compute_stream();
std::unique_ptr<Stream> make_stream();

}  // namespace dtrain::cuda
