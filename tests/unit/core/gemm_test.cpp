// GEMM wrapper against a naive triple loop for every transpose combination and odd sizes (small
// sides run on BLIS, the others on OpenBLAS).
#include <limits>
#include <random>
#include <tuple>

#include <cblas.h>
#include <gtest/gtest.h>

#include "core/ops.h"
#include "core/thread_policy.h"

namespace dtrain {
namespace {

// Checks gemm() of one shape and transposition against a naive loop in double.
void expect_gemm_matches_naive(bool ta, bool tb, int m, int n, int k) {
  std::mt19937 gen(m * 100 + n * 10 + k);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n)), c(static_cast<size_t>(m * n));
  for (auto* v : {&a, &b, &c})
    for (float& x : *v) x = dist(gen);
  const float alpha = 0.75f, beta = -0.5f;
  std::vector<double> want(c.size());
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int p = 0; p < k; ++p) {
        double av = ta ? a[p * m + i] : a[i * k + p];
        double bv = tb ? b[j * k + p] : b[p * n + j];
        s += av * bv;
      }
      want[i * n + j] = alpha * s + beta * c[i * n + j];
    }
  gemm(Device::cpu(), ta, tb, m, n, k, alpha, a.data(), b.data(), beta, c.data());
  // float32 accumulation of k products of magnitude <= 1: error ~ k * 6e-8; 1e-5 * k is loose.
  for (size_t i = 0; i < c.size(); ++i) ASSERT_NEAR(c[i], want[i], 1e-5 * (k + 1)) << i << " of " << m << "x" << n << "x" << k;
}

class Gemm : public ::testing::TestWithParam<std::tuple<bool, bool, int, int, int>> {};

TEST_P(Gemm, MatchesNaiveLoop) {
  auto [ta, tb, m, n, k] = GetParam();
  expect_gemm_matches_naive(ta, tb, m, n, k);
}

INSTANTIATE_TEST_SUITE_P(TransposesAndOddSizes, Gemm,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(), ::testing::Values(1, 7, 33),
                                            ::testing::Values(1, 13, 64), ::testing::Values(1, 5, 65)));

// beta 0 overwrites C without reading it (a gradient after zero_grad holds stale memory), on
// both CPU libraries' shapes (Note [Two CPU GEMM libraries]).
TEST(Gemm, BetaZeroIgnoresWhatCHeld) {
  for (auto [m, n, k] : {std::tuple{6, 50, 25}, std::tuple{64, 256, 784}}) {
    std::vector<float> a(static_cast<size_t>(m * k), 0.5f), b(static_cast<size_t>(k * n), 0.25f);
    std::vector<float> c(static_cast<size_t>(m * n), std::numeric_limits<float>::quiet_NaN());
    gemm(Device::cpu(), false, false, m, n, k, 1.f, a.data(), b.data(), 0.f, c.data());
    for (float v : c) ASSERT_FLOAT_EQ(v, 0.125f * static_cast<float>(k)) << m << "x" << n << "x" << k;
  }
}

// Note [One pool, sleeping waits] (core/ops.cpp): with threads, a product is cut into blocks of
// C's rows or columns, each a library call of its own; every transposition, both libraries, a
// last block shorter than the others.
TEST(Gemm, SplitAcrossThreadsMatchesNaiveLoop) {
  ASSERT_EQ(set_cpu_threads(3), 3);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (auto [m, n, k] : {std::tuple{130, 97, 1300},  // rows, OpenBLAS
                             std::tuple{40, 200, 2100},  // columns, OpenBLAS
                             std::tuple{16, 2000, 800},  // columns, BLIS (a side of 16)
                             std::tuple{1000, 30, 900}}) {  // rows, BLIS
        ASSERT_GT(plan_gemm_split(m, n, k, 3).parts, 1) << m << "x" << n << "x" << k;
        expect_gemm_matches_naive(ta, tb, m, n, k);
      }
  set_cpu_threads(1);
}

// The property behind the fix: however many threads a rank has, OpenBLAS's own pool stays at
// one thread, so no library pool spins beside dtrain's workers (3-4x slower when it did).
TEST(Gemm, LibrariesStaySingleThreaded) {
  openblas_set_num_threads(2);  // as a library user might
  EXPECT_EQ(set_cpu_threads(2), 2);
  EXPECT_EQ(openblas_get_num_threads(), 1);
  EXPECT_EQ(set_cpu_threads(0), 2);  // 0 keeps the count in force
  EXPECT_EQ(set_cpu_threads(1), 1);
  EXPECT_EQ(openblas_get_num_threads(), 1);
}

// The same product at the same thread count gives the same bits every time.
TEST(Gemm, SplitIsRepeatable) {
  set_cpu_threads(2);
  const int m = 64, n = 512, k = 784;
  std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n));
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (float& x : a) x = dist(gen);
  for (float& x : b) x = dist(gen);
  std::vector<float> first(static_cast<size_t>(m * n)), again(first.size());
  gemm(Device::cpu(), false, true, m, n, k, 1.f, a.data(), b.data(), 0.f, first.data());
  for (int r = 0; r < 20; ++r) {
    gemm(Device::cpu(), false, true, m, n, k, 1.f, a.data(), b.data(), 0.f, again.data());
    ASSERT_EQ(first, again) << r;
  }
  set_cpu_threads(1);
}

}  // namespace
}  // namespace dtrain
