// GEMM wrapper against a naive triple loop for every transpose combination and odd sizes (small
// sides run on BLIS, the others on OpenBLAS).
#include <limits>
#include <random>
#include <tuple>

#include <gtest/gtest.h>

#include "core/ops.h"

namespace dtrain {
namespace {

class Gemm : public ::testing::TestWithParam<std::tuple<bool, bool, int, int, int>> {};

TEST_P(Gemm, MatchesNaiveLoop) {
  auto [ta, tb, m, n, k] = GetParam();
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
  for (size_t i = 0; i < c.size(); ++i) EXPECT_NEAR(c[i], want[i], 1e-5 * (k + 1)) << i;
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

}  // namespace
}  // namespace dtrain
