// GpuBackend: everything the rest of dtrain asks of a GPU runtime, as one interface. Its CUDA
// implementation is the shared library libdtrain_cuda.so (core/cuda, model/cuda, comm/nccl),
// opened with dlopen the first time a run uses CUDA.
//
// Note [Loaded on use]: linking cudart, cuBLAS and NCCL into every binary cost a CPU rank of the
// seed job 236 MiB peak RSS (the libraries' relocations and initialisers), of which the CPU
// work needs under 90. Now one binary serves both: a CPU run, or an automatic device choice on
// a machine with no NVIDIA driver, never opens the library; a CUDA run opens it once.
//
// Kernels stay device-generic functors (core/launch.h): launch() hands a CUDA launch to the
// backend with the functor's type, and the library runs the instantiation it registered for
// that type (DTRAIN_REGISTER_KERNEL in core/cuda/launch.cuh).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <typeinfo>

#include "core/stream.h"

namespace dtrain {

class GpuBackend {
 public:
  virtual ~GpuBackend() = default;

  // Devices. device_count() never throws (0 with no driver or no device; the reason below).
  virtual int device_count() = 0;
  virtual std::string device_count_error() = 0;
  virtual void set_device(int index) = 0;  // pins the whole process (see core/cuda/cuda_backend.h)
  virtual std::string pci_bus_id(int index) = 0;

  // Memory (device memory through a caching allocator; pinned host memory for async copies).
  virtual void* alloc(size_t bytes, int device) = 0;
  virtual void free(void* ptr, size_t bytes, int device) = 0;
  virtual void copy(void* dst, bool dst_on_device, const void* src, bool src_on_device, size_t bytes) = 0;
  virtual void copy_async(void* dst, bool dst_on_device, const void* src, bool src_on_device, size_t bytes,
                          Stream& stream) = 0;
  virtual void zero(void* dst, size_t bytes) = 0;
  virtual void* alloc_pinned(size_t bytes) = 0;
  virtual void free_pinned(void* ptr) = 0;  // never throws

  // Row-major GEMMs on the compute stream (contract: core/ops.h).
  virtual void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                    int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) = 0;
  virtual void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                         const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c,
                         int64_t ldc) = 0;
  virtual void set_allow_tf32(bool allow) = 0;

  // Streams.
  virtual Stream& compute_stream(int device) = 0;
  virtual std::unique_ptr<Stream> make_stream(int device) = 0;

  // Runs `functor` (of type `kernel`) for i in [0, n) on the current device's compute stream.
  // Throws Error when the library has no instantiation registered for that type.
  virtual void launch(const std::type_info& kernel, int64_t n, const void* functor) = 0;
};

// Whether this build has a GPU backend: libdtrain_cuda.so beside libdtrain_core.so (or the path
// in DTRAIN_CUDA_BACKEND). Does not open it.
bool gpu_backend_available();
// Whether an NVIDIA driver is installed (/dev/nvidiactl or /proc/driver/nvidia): without one
// there is no device to count, so an automatic device choice need not open the backend.
bool gpu_driver_present();
// The backend, opened on first use. Throws Error naming the library and dlerror() when it
// cannot be opened, or saying the build has none.
GpuBackend& gpu_backend();
// A symbol of the backend library (comm/ finds its NCCL communicator factory this way); opens
// the library; throws Error when the symbol is missing.
void* gpu_backend_symbol(const char* name);

}  // namespace dtrain
