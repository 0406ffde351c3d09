#include "core/ops.h"

#include <algorithm>
#include <vector>

#include <cblas.h>

#include "core/cpu_blas.h"
#include "core/error.h"
#include "core/gpu_backend.h"
#include "core/kernels.h"
#ifdef DTRAIN_WITH_BLIS
#include "core/blis_gemm.h"
#endif

namespace dtrain {

// Note [Two CPU GEMM libraries]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// OpenBLAS 0.3.21 is slow on skinny products: the convolutions' GEMMs have 6 or 16 rows (the
// output channels) or 16 inner products (the input gradient), and there OpenBLAS reached 11-45
// GFLOP/s where BLIS 0.9 reached 31-62 (bench/kernel_bench.cpp, AMD EPYC with AVX2, 1 thread).
// On the MLP's 64 x 256 x 784 products OpenBLAS was ahead (75-85 against 65-75 GFLOP/s). So a
// product with a side of 32 or less goes to BLIS (blis_wins in core/cpu_blas.h), any other to
// OpenBLAS: on the CNN's training step that took a quarter fewer instructions (callgrind) and
// 10-30% less time. Both libraries are single-threaded per rank unless set_cpu_threads() says
// otherwise, and both give the same result for the same shape every run. DTRAIN_BLIS=off sends
// everything to OpenBLAS (for comparisons, or a machine where BLIS picks weak kernels: the
// shapes' winner was measured on AVX2 only).
void gemm(Device device, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          const float* b, float beta, float* c) {
  if (m == 0 || n == 0) return;
  const int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n, ldc = n;
  if (device.is_cpu()) {
#ifdef DTRAIN_WITH_BLIS
    if (blis_enabled() && blis_wins(m, n, k)) {
      blis_gemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
      return;
    }
#endif
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
                static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
    return;
  }
  gpu_backend().gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_bf16(Device device, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const uint16_t* a, const uint16_t* b, float beta, float* c) {
  if (m == 0 || n == 0) return;
  if (device.is_cpu()) {
    // bf16 -> float32 is exact, so this is bf16 products (exact in float32) summed in float32.
    thread_local std::vector<float> a32, b32;
    const auto widen = [](std::vector<float>& out, const uint16_t* in, int64_t count) {
      if (out.size() < static_cast<size_t>(count)) out.resize(static_cast<size_t>(count));
      launch(Device::cpu(), count, kernels::UnpackBF16{out.data(), in});
    };
    widen(a32, a, m * k);
    widen(b32, b, k * n);
    gemm(device, trans_a, trans_b, m, n, k, alpha, a32.data(), b32.data(), beta, c);
    return;
  }
  gpu_backend().gemm_bf16(trans_a, trans_b, m, n, k, alpha, a, trans_a ? m : k, b, trans_b ? k : n, beta, c, n);
}

void fill(Tensor& t, float value) { launch(t.device(), t.numel(), kernels::Fill{t.data(), value}); }

const float* ones(Tensor& t, int64_t n, Device device) {
  if (!t.defined() || t.numel() < n || t.device() != device) {
    t = Tensor::empty({n}, device);
    fill(t, 1.f);
  }
  return t.data();
}

void scale(Tensor& t, float alpha) { launch(t.device(), t.numel(), kernels::Scale{t.data(), alpha}); }

void axpy(Tensor& y, const Tensor& x, float alpha) {
  DTRAIN_CHECK(x.numel() == y.numel() && x.device() == y.device(), "axpy of {} into {}", shape_str(x.shape()),
               shape_str(y.shape()));
  launch(y.device(), y.numel(), kernels::Axpy{y.data(), x.data(), alpha});
}

int set_cpu_threads(int threads) {
  if (threads > 0) openblas_set_num_threads(threads);
#ifdef DTRAIN_WITH_BLIS
  blis_set_threads(openblas_get_num_threads());  // the same count for both libraries
#endif
  return openblas_get_num_threads();
}

void set_allow_tf32(bool allow) { gpu_backend().set_allow_tf32(allow); }

}  // namespace dtrain
