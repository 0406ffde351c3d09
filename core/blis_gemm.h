// BLIS's float32 GEMM behind core/ops.h's gemm() for the shapes where it beats OpenBLAS (Note
// [Two CPU GEMM libraries] in core/ops.cpp). A translation unit of its own: blis.h and
// OpenBLAS's cblas.h declare the same BLAS names.
#pragma once

#include <cstdint>

namespace dtrain {

// gemm()'s contract (row-major, op(A) [m,k], op(B) [k,n]) with cblas's leading dimensions
// (a block of a larger product), on the host, on the calling thread only.
void blis_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
               int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void blis_set_threads(int threads);
// The configuration BLIS picked for this CPU ("zen3", "haswell", ...; "generic" when it has no
// kernels for it, e.g. BLIS 0.9 on AMD Zen 5).
const char* blis_arch_name();

}  // namespace dtrain
