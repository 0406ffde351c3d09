// GpuBackend: everything the rest of dtrain asks of a GPU runtime, as one interface, and the
// registration point through which core reaches it. Its CUDA implementation is the plugin
// libdtrain_cuda.so (core/cuda, model/cuda), opened the first time a run uses CUDA.
//
// Note [Loaded on use]: linking cudart, cuBLAS and NCCL into every binary cost a CPU rank of the
// seed job 236 MiB peak RSS (the libraries' relocations and initialisers), of which the CPU
// work needs under 90. Now one binary serves both: a CPU run, or an automatic device choice on
// a machine with no NVIDIA driver, never opens the library; a CUDA run opens it once.
//
// Note [GPU plugins without a cycle]: core is the base every plugin links; it never opens a
// plugin itself (a plugin that links core, opened by core, would be the cycle core -> cuda ->
// core). It keeps a registration point instead: the first gpu_backend() call asks the loader
// that comm installed (comm/gpu_plugins.h, ggml's registry: base, plugins, loader) to open
// libdtrain_cuda.so. The run-time graph, NEEDED and dlopen edges together:
//   comm -> core;  comm --dlopen--> cuda -> core, cudart, cublas
//   comm --dlopen--> nccl -> cuda, core, libnccl   (comm/nccl/nccl_plugin.h)
// Each plugin exports one C function returning a struct whose first field is its API version;
// the loader refuses a library of another version with one line naming both (ggml's
// GGML_BACKEND_API_VERSION). tests/install/library_graph_test.py checks the graph has no cycle.
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
  // A and B 16-bit floats (fp16 when `fp16`, else bf16), C float32, float32 accumulation.
  virtual void gemm_half(bool fp16, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                         const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c,
                         int64_t ldc) = 0;
  // A batch of products of one shape, consecutive ones stride_* elements apart (core/ops.h gemm_batched).
  virtual void gemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                                    const float* a, int64_t lda, int64_t stride_a, const float* b, int64_t ldb,
                                    int64_t stride_b, float beta, float* c, int64_t ldc, int64_t stride_c,
                                    int64_t count) = 0;
  virtual void set_allow_tf32(bool allow) = 0;

  // Streams.
  virtual Stream& compute_stream(int device) = 0;
  virtual std::unique_ptr<Stream> make_stream(int device) = 0;

  // Runs `functor` (of type `kernel`) for i in [0, n) on the current device's compute stream.
  // Throws Error when the library has no instantiation registered for that type.
  virtual void launch(const std::type_info& kernel, int64_t n, const void* functor) = 0;
};

// The CUDA plugin's entry point and what it returns. Bump the version whenever GpuBackend or this
// struct changes: a plugin from another build is then refused instead of calling through a
// vtable of another layout.
inline constexpr uint32_t kGpuBackendApiVersion = 4;  // 3: gemm_strided_batched; 4: gemm_half (fp16)
inline constexpr const char* kGpuBackendLibrary = "libdtrain_cuda.so";
inline constexpr const char* kGpuBackendEntryPoint = "dtrain_cuda_backend_init";
struct GpuBackendPlugin {
  uint32_t api_version;  // first, so a loader can read it whatever the rest's layout
  GpuBackend* backend;
};
//   extern "C" const GpuBackendPlugin* dtrain_cuda_backend_init(void);

// Where a dtrain plugin is: DTRAIN_CUDA_BACKEND for libdtrain_cuda.so, else `library` in the
// folder of libdtrain_core.so (the build tree and installs put every dtrain library in one folder).
std::string gpu_plugin_path(const char* library);
// Whether this build has a GPU backend (libdtrain_cuda.so where gpu_plugin_path says). Does not
// open it.
bool gpu_backend_available();
// Whether an NVIDIA driver is installed (/dev/nvidiactl or /proc/driver/nvidia): without one
// there is no device to count, so an automatic device choice need not open the backend.
bool gpu_driver_present();

// The registration point (Note [GPU plugins without a cycle]). The loader opens the plugin and
// returns its backend, or throws Error naming the library and why. comm installs it
// (install_gpu_backend_loader in comm/gpu_plugins.h, called by dtrain::init and when
// libdtrain_comm is loaded); a program without it has no loader, and asking for the backend says so.
using GpuBackendLoader = GpuBackend& (*)();
void set_gpu_backend_loader(GpuBackendLoader loader);
// The backend, loaded on first use (once; a failure is remembered and thrown again).
GpuBackend& gpu_backend();

}  // namespace dtrain
