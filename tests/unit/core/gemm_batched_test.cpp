// gemm_batched (core/ops.h): every product of a strided batch, each a block of a larger matrix
// (leading dimensions above the product's width), against a naive loop; the entries outside the
// blocks untouched; at 2 threads the same floats when the batch is shared among the threads, and
// within rounding when one product is cut as gemm() cuts it.
#include <random>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/ops.h"

namespace dtrain {
namespace {

struct Case {
  bool ta, tb;
  int64_t m, n, k, count;
};

// Storage per product: op(A) [m, k] inside rows of width lda (stored [k, m] when transposed), likewise
// B and C; products `pad` elements apart beyond their own extent. Returns C after the call.
std::vector<float> run_case(const Case& c, int threads, std::vector<double>* want = nullptr) {
  const int64_t pad = 3;
  const int64_t a_rows = c.ta ? c.k : c.m, a_cols = c.ta ? c.m : c.k, lda = a_cols + 2;
  const int64_t b_rows = c.tb ? c.n : c.k, b_cols = c.tb ? c.k : c.n, ldb = b_cols + 1;
  const int64_t ldc = c.n + 5;
  const int64_t sa = a_rows * lda + pad, sb = b_rows * ldb + pad, sc = c.m * ldc + pad;
  std::mt19937 gen(static_cast<uint32_t>(c.m * 1000 + c.n * 10 + c.k + c.count));
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> a(static_cast<size_t>(sa * c.count)), b(static_cast<size_t>(sb * c.count)),
      out(static_cast<size_t>(sc * c.count));
  for (auto* v : {&a, &b, &out})
    for (float& x : *v) x = dist(gen);
  const float alpha = 0.5f, beta = -0.25f;
  if (want) {
    want->assign(out.begin(), out.end());
    for (int64_t p = 0; p < c.count; ++p)
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t j = 0; j < c.n; ++j) {
          double s = 0;
          for (int64_t q = 0; q < c.k; ++q) {
            const double av = c.ta ? a[p * sa + q * lda + i] : a[p * sa + i * lda + q];
            const double bv = c.tb ? b[p * sb + j * ldb + q] : b[p * sb + q * ldb + j];
            s += av * bv;
          }
          double& w = (*want)[p * sc + i * ldc + j];
          w = alpha * s + beta * w;
        }
  }
  set_cpu_threads(threads);
  gemm_batched(Device::cpu(), c.ta, c.tb, c.m, c.n, c.k, alpha, a.data(), lda, b.data(), ldb, beta, out.data(), ldc,
               {c.count, sa, sb, sc});
  set_cpu_threads(1);
  return out;
}

class GemmBatched : public ::testing::TestWithParam<std::tuple<bool, bool, int>> {};

TEST_P(GemmBatched, EveryProductMatchesNaiveLoopAndNothingElseIsWritten) {
  const auto [ta, tb, shape] = GetParam();
  // Small products (BLIS), larger ones (OpenBLAS), a batch of one, a batch with work enough to be
  // shared among 2 threads (kGemmMinFlopsPerThread: 2 x 16 MFLOP), and one product cut in two.
  const Case cases[] = {{ta, tb, 5, 7, 3, 4},     {ta, tb, 40, 64, 33, 3},   {ta, tb, 64, 130, 64, 1},
                        {ta, tb, 64, 256, 64, 16}, {ta, tb, 256, 520, 128, 1}};
  const Case& c = cases[shape];
  std::vector<double> want;
  const std::vector<float> got = run_case(c, 1, &want);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5 * (c.k + 1)) << i;
  const std::vector<float> two = run_case(c, 2);
  if (shape < 4) {  // whole products per thread: the same library call each, the same floats
    EXPECT_EQ(two, got) << "2 threads changed the floats";
  } else {  // one product cut in two: each half its own call, equal within rounding (gemm()'s contract)
    for (size_t i = 0; i < two.size(); ++i) ASSERT_NEAR(two[i], want[i], 1e-5 * (c.k + 1)) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(TransposesAndShapes, GemmBatched,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(), ::testing::Values(0, 1, 2, 3, 4)));

TEST(GemmBatched, LeadingDimensionTooSmallIsAnError) {
  std::vector<float> a(16), b(16), c(16);
  EXPECT_THROW(gemm_batched(Device::cpu(), false, false, 2, 2, 2, 1.f, a.data(), 1, b.data(), 2, 0.f, c.data(), 2,
                            {1, 0, 0, 0}),
               Error);
}

}  // namespace
}  // namespace dtrain
