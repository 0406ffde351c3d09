// The CUDA runtime inside the GPU backend library: plain C++ declarations (no CUDA headers),
// implemented in core/cuda/*.cu / *.cpp. The rest of dtrain reaches these through GpuBackend
// (core/gpu_backend.h, implemented by gpu_backend_impl.cpp); the GPU tests, which link the
// library, call them directly.
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

// Why device_count() is 0: "cudaGetDeviceCount: <CUDA's error string>", or "cudaGetDeviceCount
// returned 0 devices"; empty when devices are visible. For skip messages and logs.
std::string device_count_error();
// The device this thread works on. set_device() pins the whole process: a thread that never
// called it (the DDP communication thread, a watchdog) is moved to the pinned device on its
// first dtrain CUDA call, since CUDA's current device is per thread and starts at 0.
int current_device();
// True when `ptr` is device memory (cudaMalloc'd, on any device); false for host pointers.
bool is_device_pointer(const void* ptr);

// Caching allocator (cudaMalloc only, never managed memory).
void* alloc(size_t bytes, int device);
void free(void* ptr, size_t bytes, int device);
// Returns every cached (free) block to CUDA (cudaFree) on all devices; blocks in use stay.
void release_cached();
struct AllocatorStats {
  size_t in_use_bytes = 0;   // handed out and not yet freed (rounded sizes)
  size_t cached_bytes = 0;   // free blocks kept for reuse
  int64_t device_mallocs = 0;  // calls that reached cudaMalloc
  int64_t cache_hits = 0;      // allocations served from the cache
};
AllocatorStats allocator_stats(int device);
// Stream-ordered on the compute stream; returns once the copy is complete.
void copy(void* dst, bool dst_on_device, const void* src, bool src_on_device, size_t bytes);
// Queues the copy on `stream` (a CUDA stream) and returns at once: the source must stay
// unchanged, and the destination unread, until an event recorded on `stream` after it
// completes. Host memory must be pinned (alloc_pinned) for the copy to be truly asynchronous.
void copy_async(void* dst, bool dst_on_device, const void* src, bool src_on_device, size_t bytes, Stream& stream);
// Page-locked host memory (cudaHostAlloc, portable across devices): what asynchronous
// host<->device copies need. nullptr for 0 bytes. free_pinned never throws (destructors call it).
void* alloc_pinned(size_t bytes);
void free_pinned(void* ptr);
void zero(void* dst, size_t bytes);

}  // namespace dtrain::cuda

namespace dtrain::cuda {

// Row-major GEMM through cuBLAS on the compute stream (see core/ops.h for the contract).
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void set_allow_tf32(bool allow);
// A batch of them, consecutive products stride_* elements apart (cublasSgemmStridedBatched).
void gemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                          int64_t lda, int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b, float beta,
                          float* c, int64_t ldc, int64_t stride_c, int64_t count);
// The same with 16-bit A and B (raw words: fp16 when `fp16`, else bf16), float32 C and float32
// accumulation (cublasGemmEx, CUBLAS_COMPUTE_32F): tensor cores on sm_80+.
void gemm_half(bool fp16, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
               int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace dtrain::cuda

namespace dtrain::cuda {

// The process's compute stream (created on first use, on the current device).
Stream& compute_stream();
// The same for an explicit device (core/stream.h's compute_stream(Device) can pass its index).
Stream& compute_stream(int device);
std::unique_ptr<Stream> make_stream(int device);

}  // namespace dtrain::cuda
