// GEMM through cuBLAS on the compute stream: float32 (cublasSgemm) and bf16 or fp16 inputs with float32
// output and accumulation (cublasGemmEx). cuBLAS is column-major and dtrain row-major: a
// row-major matrix is its column-major transpose, so C = op(A) op(B) is computed as
// C^T = op(B)^T op(A)^T, i.e. cuBLAS called with the operands (and m, n) swapped.
#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <memory>
#include <mutex>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_stream.h"
#include "core/cuda/device_guard.h"

namespace dtrain::cuda {

namespace {

struct Blas {
  cublasHandle_t handle = nullptr;
  std::mutex mutex;  // a handle's stream and math mode are shared state
};

// One handle per device, never destroyed (cublasDestroy at exit races the runtime tear-down).
std::array<std::atomic<Blas*>, kMaxDevices> g_blas{};
std::mutex g_blas_mutex;
std::atomic<bool> g_allow_tf32{false};

Blas& blas_for(int device) {
  DTRAIN_CHECK(device >= 0 && device < kMaxDevices, "CUDA device {} beyond dtrain's limit of {}", device,
               kMaxDevices);
  Blas* blas = g_blas[device].load(std::memory_order_acquire);
  if (!blas) {
    std::lock_guard lock(g_blas_mutex);
    blas = g_blas[device].load(std::memory_order_relaxed);
    if (!blas) {
      DeviceGuard guard(device);
      auto fresh = std::make_unique<Blas>();
      CUBLAS_CHECK(cublasCreate(&fresh->handle));
      blas = fresh.release();
      g_blas[device].store(blas, std::memory_order_release);
    }
  }
  return *blas;
}

int to_int(int64_t v, const char* what) {
  DTRAIN_CHECK(v >= 0 && v <= INT_MAX, "cuBLAS GEMM {} = {} does not fit in int", what, v);
  return static_cast<int>(v);
}

// cuBLAS's int arguments. cuBLAS rejects a leading dimension below 1 even when k == 0 and
// nothing is read.
struct GemmDims {
  int m, n, k, lda, ldb, ldc;
  GemmDims(int64_t m64, int64_t n64, int64_t k64, int64_t lda64, int64_t ldb64, int64_t ldc64)
      : m(to_int(m64, "m")),
        n(to_int(n64, "n")),
        k(to_int(k64, "k")),
        lda(std::max(1, to_int(lda64, "lda"))),
        ldb(std::max(1, to_int(ldb64, "ldb"))),
        ldc(std::max(1, to_int(ldc64, "ldc"))) {}
};

// The current device's handle, locked and bound to its compute stream.
class BoundBlas {
 public:
  BoundBlas() : blas_(blas_for(current_device())), lock_(blas_.mutex) {
    CUBLAS_CHECK(cublasSetStream(blas_.handle, compute_stream_handle()));
  }
  cublasHandle_t handle() const { return blas_.handle; }

 private:
  Blas& blas_;
  std::lock_guard<std::mutex> lock_;
};

cublasOperation_t op(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const GemmDims d(m, n, k, lda, ldb, ldc);
  BoundBlas blas;
  CUBLAS_CHECK(cublasSetMathMode(blas.handle(), g_allow_tf32.load(std::memory_order_relaxed)
                                                    ? CUBLAS_TF32_TENSOR_OP_MATH
                                                    : CUBLAS_DEFAULT_MATH));
  // Column-major view: C^T[n,m] = op(B)^T[n,k] * op(A)^T[k,m]. Row-major B (stored [k,n], or
  // [n,k] when trans_b) is column-major B^T with leading dimension ldb; same for A.
  CUBLAS_CHECK(cublasSgemm(blas.handle(), op(trans_b), op(trans_a), d.n, d.m, d.k, &alpha, b, d.ldb, a, d.lda, &beta,
                           c, d.ldc));
}

void gemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                          int64_t lda, int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b, float beta,
                          float* c, int64_t ldc, int64_t stride_c, int64_t count) {
  if (m == 0 || n == 0 || count == 0) return;
  const GemmDims d(m, n, k, lda, ldb, ldc);
  BoundBlas blas;
  CUBLAS_CHECK(cublasSetMathMode(blas.handle(), g_allow_tf32.load(std::memory_order_relaxed)
                                                    ? CUBLAS_TF32_TENSOR_OP_MATH
                                                    : CUBLAS_DEFAULT_MATH));
  // The column-major view of gemm() above, product by product.
  CUBLAS_CHECK(cublasSgemmStridedBatched(blas.handle(), op(trans_b), op(trans_a), d.n, d.m, d.k, &alpha, b, d.ldb,
                                         stride_b, a, d.lda, stride_a, &beta, c, d.ldc, stride_c,
                                         to_int(count, "batch count")));
}

void gemm_half(bool fp16, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const GemmDims d(m, n, k, lda, ldb, ldc);
  BoundBlas blas;
  // The compute type alone fixes the arithmetic: 16-bit products summed in float32 (tensor cores).
  const cudaDataType_t type = fp16 ? CUDA_R_16F : CUDA_R_16BF;
  CUBLAS_CHECK(cublasGemmEx(blas.handle(), op(trans_b), op(trans_a), d.n, d.m, d.k, &alpha, b, type, d.ldb, a,
                            type, d.lda, &beta, c, CUDA_R_32F, d.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }

}  // namespace dtrain::cuda
