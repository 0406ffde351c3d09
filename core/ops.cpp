#include "core/ops.h"

#include <algorithm>
#include <memory>
#include <vector>

#include <cblas.h>

#include "core/cpu_blas.h"
#include "core/cpu_workers.h"
#include "core/error.h"
#include "core/gpu_backend.h"
#include "core/kernels.h"
#include "core/thread_policy.h"
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
// 10-30% less time. Both libraries always run single-threaded (Note [One pool, sleeping
// waits]), and both give the same result for the same shape every run. DTRAIN_BLIS=off sends
// everything to OpenBLAS (for comparisons), DTRAIN_BLIS=on every skinny product to BLIS.
// Without either, BLIS is used only where it has kernels for the CPU (blis_chosen): BLIS 0.9
// predates AMD Zen 5 (family 26) and runs its "generic" reference kernels there, and on such a
// host (1 thread, best of many calls) every skinny shape ran 3-5x slower on BLIS than on
// OpenBLAS: 6 x 50176 x 25 1085 against 309 us, 16 x 6400 x 150 1213 against 377, 150 x 6400 x
// 16 1240 against 354, the 2048-wide MLP's output layer 157/126/119 against 47/44/32 us
// (forward, weight and input gradient). Those three ran on the main thread alone (each under
// the split's minimum), about a tenth of a 2-thread step at hidden 2048.
//
// Note [One pool, sleeping waits]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With each library's own threads, one process on 2 cores ran 3-4x slower at --threads 2 than
// at 1 (issue 20). OpenBLAS (pthreads) and BLIS (libgomp) each keep a pool, and both pools
// busy-wait after every call (OpenBLAS for ~0.1 s, with sched_yield; libgomp for its spin
// count): the MLP's step alternates OpenBLAS's big products with BLIS's skinny ones, so both
// pools' workers spun at once beside the main thread, 3 busy threads on 2 cores, and each
// parallel call waited for a worker the other pool's spinner had pushed off its core.
// Measured (old main, machine shared with 4 builds: load 15): --threads 1 28-70k samples/s,
// --threads 2 430-640, OMP_WAIT_POLICY=passive 1.9-2.1k, DTRAIN_BLIS=off (OpenBLAS's pool
// alone) 6-27k. So neither library threads any more: gemm() cuts a product into blocks of
// C's rows or columns (plan_gemm_split in core/thread_policy.h) and runs them on dtrain's own
// CpuWorkers, whose idle threads sleep on a condition variable, each block a single-threaded
// call of the library the whole product's shape picks. A product too small to pay for a
// wake-up stays on the calling thread. Every element of C is one library call's sum over the
// whole k, so a run is bitwise repeatable at a given thread count. What two threads gain
// (2-core VM, best of 1000 calls): 1.8-1.9x on the forward products (64 x 256 x 784 272 -> 145
// us, 64 x 2048 x 784 2303 -> 1282 us), nothing on the weight gradients' k = 64 products
// (256 x 784 245 -> 259 us, 2048 x 784 2288 -> 2190 us), which read and write all of C for
// 128 FLOPs per element: memory-bound here, as the optimizer's pass over the weights is.
namespace {

void single_threaded_libraries() {
  openblas_set_num_threads(1);
#ifdef DTRAIN_WITH_BLIS
  blis_set_threads(1);
#endif
}

// The process's workers: one thread (none started) until set_cpu_threads() says otherwise. The
// libraries' own pools are turned off before the first product, also in a program that never
// calls set_cpu_threads().
std::unique_ptr<CpuWorkers>& cpu_workers() {
  static std::unique_ptr<CpuWorkers> workers = [] {
    single_threaded_libraries();
    return std::make_unique<CpuWorkers>(1);
  }();
  return workers;
}

// One single-threaded library call with explicit leading dimensions (a block of a product).
void cpu_gemm_block(bool use_blis, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
#ifdef DTRAIN_WITH_BLIS
  if (use_blis) {
    blis_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
#else
  (void)use_blis;
#endif
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

}  // namespace

namespace {

// One CPU product with leading dimensions, cut across the rank's threads (plan_gemm_split).
void cpu_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const bool use_blis = blis_enabled() && blis_wins(m, n, k);
  CpuWorkers& workers = *cpu_workers();
  const GemmSplit split = plan_gemm_split(m, n, k, workers.threads());
  if (split.parts == 1) {
    cpu_gemm_block(use_blis, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  workers.run(split.parts, [&](int part) {
    const auto [begin, end] = split.range(part);
    if (split.rows)  // rows of op(A) and C: A advances by rows, or by columns when stored transposed
      cpu_gemm_block(use_blis, trans_a, trans_b, end - begin, n, k, alpha, a + (trans_a ? begin : begin * lda), lda,
                     b, ldb, beta, c + begin * ldc, ldc);
    else  // columns of op(B) and C
      cpu_gemm_block(use_blis, trans_a, trans_b, m, end - begin, k, alpha, a, lda,
                     b + (trans_b ? begin * ldb : begin), ldb, beta, c + begin, ldc);
  });
}

}  // namespace

void gemm(Device device, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          const float* b, float beta, float* c) {
  if (m == 0 || n == 0) return;
  const int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n, ldc = n;
  if (!device.is_cpu()) {
    gpu_backend().gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  cpu_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_batched(Device device, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
                  const GemmBatch& batch) {
  if (m == 0 || n == 0 || batch.count <= 0) return;
  DTRAIN_CHECK(lda >= (trans_a ? m : k) && ldb >= (trans_b ? k : n) && ldc >= n,
               "gemm_batched: leading dimensions {}, {}, {} too small for {} x {} x {}", lda, ldb, ldc, m, n, k);
  if (!device.is_cpu()) {
    gpu_backend().gemm_strided_batched(trans_a, trans_b, m, n, k, alpha, a, lda, batch.stride_a, b, ldb,
                                       batch.stride_b, beta, c, ldc, batch.stride_c, batch.count);
    return;
  }
  const auto one = [&](int64_t i, bool threaded) {
    const float* ai = a + i * batch.stride_a;
    const float* bi = b + i * batch.stride_b;
    float* ci = c + i * batch.stride_c;
    if (threaded)
      cpu_gemm(trans_a, trans_b, m, n, k, alpha, ai, lda, bi, ldb, beta, ci, ldc);
    else
      cpu_gemm_block(blis_enabled() && blis_wins(m, n, k), trans_a, trans_b, m, n, k, alpha, ai, lda, bi, ldb, beta,
                     ci, ldc);
  };
  // Whole products per thread when there are enough of them and enough work to pay for a wake-up
  // (kGemmMinFlopsPerThread); else each product alone, cut as gemm() cuts it.
  CpuWorkers& workers = *cpu_workers();
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) *
                       static_cast<double>(batch.count);
  const int64_t parts = std::min({static_cast<int64_t>(workers.threads()), batch.count,
                                  static_cast<int64_t>(flops / kGemmMinFlopsPerThread)});
  if (parts <= 1 || batch.count < workers.threads()) {
    for (int64_t i = 0; i < batch.count; ++i) one(i, true);
    return;
  }
  const int64_t per_part = (batch.count + parts - 1) / parts;
  workers.run(static_cast<int>(parts), [&](int part) {
    const int64_t begin = std::min(batch.count, part * per_part), end = std::min(batch.count, begin + per_part);
    for (int64_t i = begin; i < end; ++i) one(i, false);
  });
}

void cpu_parallel_ranges(int64_t n, void (*body)(const void* ctx, int64_t begin, int64_t end), const void* ctx) {
  CpuWorkers& workers = *cpu_workers();
  const int parts = workers.threads();
  if (parts == 1) {
    body(ctx, 0, n);
    return;
  }
  // Ranges of whole cache lines (16 floats), so no two threads write one line.
  const int64_t per_part = ((n + parts - 1) / parts + 15) / 16 * 16;
  workers.run(parts, [&](int part) {
    const int64_t begin = std::min(n, part * per_part), end = std::min(n, begin + per_part);
    if (begin < end) body(ctx, begin, end);
  });
}

void pack_half(DType half, const Tensor& src, Tensor& dst) {
  DTRAIN_CHECK(half == DType::kBF16 || half == DType::kF16, "pack_half to {}", dtype_name(half));
  ensure_tensor(dst, src.shape(), src.device(), half);
  if (half == DType::kF16)
    launch(src.device(), src.numel(), kernels::PackFP16{dst.data_as<uint16_t>(), src.data(), 1.f});
  else
    launch(src.device(), src.numel(), kernels::PackBF16{dst.data_as<uint16_t>(), src.data(), 1.f});
}

void gemm_half_strided(Device device, DType half, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                       float alpha, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c,
                       int64_t ldc) {
  DTRAIN_CHECK(half == DType::kBF16 || half == DType::kF16, "gemm_half of {}", dtype_name(half));
  // Stored shapes: A is [m,k] ([k,m] when trans_a), B is [k,n] ([n,k] when trans_b).
  const int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
  const int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
  DTRAIN_CHECK(lda >= a_cols && ldb >= b_cols && ldc >= n, "gemm_half: row strides {}/{}/{} below widths {}/{}/{}",
               lda, ldb, ldc, a_cols, b_cols, n);
  if (m == 0 || n == 0) return;
  if (device.is_cpu()) {
    // Widening is exact, so this is 16-bit products (exact in float32) summed in float32.
    thread_local std::vector<float> a32, b32;
    const auto widen = [half](std::vector<float>& out, const uint16_t* in, int64_t rows, int64_t cols, int64_t ld) {
      if (out.size() < static_cast<size_t>(rows * cols)) out.resize(static_cast<size_t>(rows * cols));
      for (int64_t r = 0; r < (ld == cols ? 1 : rows); ++r) {  // contiguous: one launch for all
        const int64_t count = ld == cols ? rows * cols : cols;
        if (half == DType::kF16)
          launch(Device::cpu(), count, kernels::UnpackFP16{out.data() + r * cols, in + r * ld});
        else
          launch(Device::cpu(), count, kernels::UnpackBF16{out.data() + r * cols, in + r * ld});
      }
    };
    widen(a32, a, a_rows, a_cols, lda);
    widen(b32, b, b_rows, b_cols, ldb);
    if (ldc == n)
      gemm(device, trans_a, trans_b, m, n, k, alpha, a32.data(), b32.data(), beta, c);
    else
      gemm_batched(device, trans_a, trans_b, m, n, k, alpha, a32.data(), a_cols, b32.data(), b_cols, beta, c, ldc, {});
    return;
  }
  gpu_backend().gemm_half(half == DType::kF16, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_half(Device device, DType half, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const uint16_t* a, const uint16_t* b, float beta, float* c) {
  gemm_half_strided(device, half, trans_a, trans_b, m, n, k, alpha, a, trans_a ? m : k, b, trans_b ? k : n, beta, c, n);
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
  // The libraries never thread on their own (Note [One pool, sleeping waits]); a library user
  // may have changed OpenBLAS's count since.
  single_threaded_libraries();
  std::unique_ptr<CpuWorkers>& workers = cpu_workers();
  if (threads > 0 && threads != workers->threads()) {
    workers.reset();  // joins the old workers before the new ones start
    try {
      workers = std::make_unique<CpuWorkers>(threads);
    } catch (...) {
      workers = std::make_unique<CpuWorkers>(1);  // never left without a pool
      throw;
    }
  }
  return workers->threads();
}

void set_allow_tf32(bool allow) { gpu_backend().set_allow_tf32(allow); }

}  // namespace dtrain
