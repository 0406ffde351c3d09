// Tensor-level math that every layer needs: GEMM (OpenBLAS on CPU, cuBLAS on CUDA) and a few
// elementwise helpers over launch().
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace dtrain {

// Row-major C[m,n] = alpha * op(A) * op(B) + beta * C, all contiguous on `device`.
// op(A) is [m,k] (A stored [k,m] when trans_a); op(B) is [k,n] (B stored [n,k] when trans_b).
void gemm(Device device, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          const float* b, float beta, float* c);

// The same contract with A and B in a 16-bit float format `half` (DType::kBF16 or kF16; raw
// 16-bit words, see core/kernels.h) and C in float32, products summed in float32: the matmul of
// mixed-precision (autocast) training. CUDA: cuBLAS GemmEx on tensor cores. CPU: A and B widened
// to float32 (exact for both formats) into per-thread scratch that only grows, then the float32
// GEMM; a product of two 16-bit values is exact in float32, so this is the same numerics, for
// tests, not for speed.
void gemm_half(Device device, DType half, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const uint16_t* a, const uint16_t* b, float beta, float* c);
// gemm_half with the row strides of A, B and C as stored (row-major), each at least its stored
// width: a product may read or write a block of a wider matrix (the LM head's padded logits,
// Note [Padded logits] in model/embedding.cpp). CPU: the blocks are widened into contiguous
// scratch, then one float32 GEMM writes C in place.
void gemm_half_strided(Device device, DType half, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                       float alpha, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c,
                       int64_t ldc);
inline void gemm_bf16(Device device, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                      const uint16_t* a, const uint16_t* b, float beta, float* c) {
  gemm_half(device, DType::kBF16, trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
}

// dst = src rounded to `half` (core/kernels.h PackBF16 / PackFP16: to nearest even; fp16 above
// 65504 becomes infinity, below 2^-14 an IEEE subnormal), same shape, on src's device:
// gemm_half's operands. dst is reused while its shape holds (a layer packs into the same tensor
// every step).
void pack_half(DType half, const Tensor& src, Tensor& dst);
inline void pack_bf16(const Tensor& src, Tensor& dst) { pack_half(DType::kBF16, src, dst); }

// A batch of `count` products of one shape, with leading dimensions: for i in [0, count),
// C_i = alpha * op(A_i) * op(B_i) + beta * C_i, A_i = a + i * stride_a (B and C alike). lda, ldb
// and ldc are the row strides of A, B and C as stored (row-major), so a product may read or write
// a block of a larger matrix: attention's per-head products over a causal block of rows (one call
// per block for all B*H heads, model/attention.cpp). CPU: the products are shared among the
// rank's threads, each one library call (alone, one product is cut as gemm() cuts it); CUDA: one
// cublasSgemmStridedBatched. Same result every run at a given thread count.
struct GemmBatch {
  int64_t count = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements between consecutive products
};
void gemm_batched(Device device, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
                  const GemmBatch& batch);

void fill(Tensor& t, float value);
// A vector of at least n ones on `device`, kept in `t` and only ever grown (a smaller n uses a
// prefix): layers compute bias gradients as a GEMM against it.
const float* ones(Tensor& t, int64_t n, Device device);
void scale(Tensor& t, float alpha);            // t *= alpha
void axpy(Tensor& y, const Tensor& x, float alpha);  // y += alpha * x

// Threads the CPU GEMM may use in this process (dtrain's CpuWorkers; OpenBLAS and BLIS are
// kept single-threaded: Note [One pool, sleeping waits] in ops.cpp); 0 keeps the count in
// force. Returns that count. Call it while no GEMM runs. How many a rank should use is
// core/thread_policy.h's decision.
int set_cpu_threads(int threads);

// Whether cuBLAS may use TF32 tensor cores for float32 GEMM (off by default, as in PyTorch).
// Opens the GPU backend: call it on CUDA runs only.
void set_allow_tf32(bool allow);

}  // namespace dtrain
