// The GpuBackend (core/gpu_backend.h) of this library: each call forwards to the CUDA runtime
// functions of cuda_backend.h. dtrain_cuda_backend_init() is the plugin's one entry point, which
// comm's loader (comm/gpu_plugins.cpp) calls after opening the library and checks the version of.
#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_registry.h"
#include "core/gpu_backend.h"

namespace dtrain::cuda {

namespace {

class CudaGpuBackend final : public GpuBackend {
 public:
  int device_count() override { return cuda::device_count(); }
  std::string device_count_error() override { return cuda::device_count_error(); }
  void set_device(int index) override { cuda::set_device(index); }
  std::string pci_bus_id(int index) override { return cuda::pci_bus_id(index); }

  void* alloc(size_t bytes, int device) override { return cuda::alloc(bytes, device); }
  void free(void* ptr, size_t bytes, int device) override { cuda::free(ptr, bytes, device); }
  void copy(void* dst, bool dst_on_device, const void* src, bool src_on_device, size_t bytes) override {
    cuda::copy(dst, dst_on_device, src, src_on_device, bytes);
  }
  void copy_async(void* dst, bool dst_on_device, const void* src, bool src_on_device, size_t bytes,
                  Stream& stream) override {
    cuda::copy_async(dst, dst_on_device, src, src_on_device, bytes, stream);
  }
  void zero(void* dst, size_t bytes) override { cuda::zero(dst, bytes); }
  void* alloc_pinned(size_t bytes) override { return cuda::alloc_pinned(bytes); }
  void free_pinned(void* ptr) override { cuda::free_pinned(ptr); }

  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
            const float* b, int64_t ldb, float beta, float* c, int64_t ldc) override {
    cuda::gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  void gemm_half(bool fp16, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) override {
    cuda::gemm_half(fp16, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  void gemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                            int64_t lda, int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b, float beta,
                            float* c, int64_t ldc, int64_t stride_c, int64_t count) override {
    cuda::gemm_strided_batched(trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
                               stride_c, count);
  }
  void set_allow_tf32(bool allow) override { cuda::set_allow_tf32(allow); }

  Stream& compute_stream(int device) override { return cuda::compute_stream(device); }
  std::unique_ptr<Stream> make_stream(int device) override { return cuda::make_stream(device); }

  void launch(const std::type_info& kernel, int64_t n, const void* functor) override {
    launch_registered(kernel, n, functor);
  }
};

}  // namespace

}  // namespace dtrain::cuda

extern "C" const dtrain::GpuBackendPlugin* dtrain_cuda_backend_init() {
  static dtrain::cuda::CudaGpuBackend backend;
  static const dtrain::GpuBackendPlugin plugin{dtrain::kGpuBackendApiVersion, &backend};
  return &plugin;
}
