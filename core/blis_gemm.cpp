// BLIS's typed API: strides instead of transposition flags, so a row-major transposed operand
// is the same memory read with its row and column strides swapped.
#include "core/blis_gemm.h"

#include <blis.h>

namespace dtrain {

void blis_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
               const float* b, float beta, float* c) {
  // op(A)[i, p] lies at i*rs + p*cs: stored [m,k] row-major, or [k,m] when transposed.
  const inc_t rs_a = trans_a ? 1 : k, cs_a = trans_a ? m : 1;
  const inc_t rs_b = trans_b ? 1 : n, cs_b = trans_b ? k : 1;
  // BLIS takes non-const pointers but only reads A, B, alpha and beta.
  bli_sgemm(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m, n, k, &alpha, const_cast<float*>(a), rs_a, cs_a,
            const_cast<float*>(b), rs_b, cs_b, &beta, c, n, 1);
}

void blis_set_threads(int threads) { bli_thread_set_num_threads(threads); }

}  // namespace dtrain
