// BLIS's typed API: strides instead of transposition flags, so a row-major transposed operand
// is the same memory read with its row and column strides swapped.
#include "core/blis_gemm.h"

#include <blis.h>

namespace dtrain {

void blis_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
               int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  // op(A)[i, p] lies at i*rs + p*cs: rows of lda floats, or transposed (op(A) is A's columns).
  const inc_t rs_a = trans_a ? 1 : lda, cs_a = trans_a ? lda : 1;
  const inc_t rs_b = trans_b ? 1 : ldb, cs_b = trans_b ? ldb : 1;
  // BLIS takes non-const pointers but only reads A, B, alpha and beta.
  bli_sgemm(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m, n, k, &alpha, const_cast<float*>(a), rs_a, cs_a,
            const_cast<float*>(b), rs_b, cs_b, &beta, c, ldc, 1);
}

void blis_set_threads(int threads) { bli_thread_set_num_threads(threads); }

const char* blis_arch_name() { return bli_arch_string(bli_arch_query_id()); }

}  // namespace dtrain
