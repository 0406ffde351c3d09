// cuBLAS GEMM against the CPU (OpenBLAS) GEMM for the row-major contract of core/ops.h: every
// transpose combination, odd sizes, k = 0, alpha/beta, and TF32 mode.
#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "core/ops.h"
#include "core/tensor.h"
#include "tests/gpu/gpu_test.h"

namespace dtrain {
namespace {

using testing::GpuTest;

std::vector<float> random_values(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// C = alpha op(A) op(B) + beta C on both devices; returns the largest |gpu - cpu|.
float max_gemm_difference(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, float beta, unsigned seed) {
  std::vector<float> a = random_values(static_cast<size_t>(m * k), seed);
  std::vector<float> b = random_values(static_cast<size_t>(k * n), seed + 1);
  std::vector<float> c = random_values(static_cast<size_t>(m * n), seed + 2);
  // Shapes as stored: A is [k,m] when transposed, B is [n,k].
  Tensor ga = Tensor::from_vector(a, {ta ? k : m, ta ? m : k}, Device::cuda(0));
  Tensor gb = Tensor::from_vector(b, {tb ? n : k, tb ? k : n}, Device::cuda(0));
  Tensor gc = Tensor::from_vector(c, {m, n}, Device::cuda(0));
  gemm(Device::cuda(0), ta, tb, m, n, k, alpha, ga.data(), gb.data(), beta, gc.data());
  gemm(Device::cpu(), ta, tb, m, n, k, alpha, a.data(), b.data(), beta, c.data());
  std::vector<float> got = gc.to_vector();
  float worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - c[i]));
  return worst;
}

class GpuGemm : public GpuTest, public ::testing::WithParamInterface<std::tuple<bool, bool>> {};

TEST_P(GpuGemm, MatchesCpuForOddSizes) {
  const auto [ta, tb] = GetParam();
  const int64_t sizes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 65}, {128, 64, 96}, {257, 129, 300}, {1, 513, 31}};
  unsigned seed = 1;
  for (const auto& s : sizes) {
    const int64_t m = s[0], n = s[1], k = s[2];
    // FP32 accumulation in a different order: entries are sums of k products of values in
    // [-1, 1], so allow k * 4 float epsilons (~5e-5 at k = 100).
    const float tol = 4.0f * static_cast<float>(k) * 1.2e-7f + 1e-6f;
    EXPECT_LE(max_gemm_difference(ta, tb, m, n, k, 0.7f, 0.3f, seed++), tol)
        << "m=" << m << " n=" << n << " k=" << k << " trans_a=" << ta << " trans_b=" << tb;
    EXPECT_LE(max_gemm_difference(ta, tb, m, n, k, 1.0f, 0.0f, seed++), tol) << "beta = 0";
  }
}

TEST_P(GpuGemm, EmptyInnerDimensionScalesC) {
  const auto [ta, tb] = GetParam();
  // k = 0: C = beta * C, and leading dimensions of 0 must not upset cuBLAS.
  EXPECT_EQ(max_gemm_difference(ta, tb, 4, 3, 0, 1.0f, 0.5f, 99), 0.0f);
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, GpuGemm, ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "At" : "A") +
                                  (std::get<1>(info.param) ? "Bt" : "B");
                         });

using GpuGemmTf32 = GpuTest;

TEST_F(GpuGemmTf32, Tf32IsCloseButOnlyWhenAllowed) {
  // TF32 keeps 10 mantissa bits (relative error ~5e-4 per product): at k = 512 the sum of 512
  // products of magnitude <= 1 stays within 0.05 of the FP32 result. Float32 accumulation in
  // another order stays within 4 k float epsilons; TF32 rounding of 256 x 256 x 512 random
  // operands must show above that, or TF32 was never switched on.
  const float fp32_bound = 4.0f * 512 * 1.2e-7f;
  set_allow_tf32(true);
  const float tf32 = max_gemm_difference(false, false, 256, 256, 512, 1.0f, 0.0f, 7);
  set_allow_tf32(false);
  const float fp32 = max_gemm_difference(false, false, 256, 256, 512, 1.0f, 0.0f, 7);
  EXPECT_LE(tf32, 0.05f);
  EXPECT_GT(tf32, fp32_bound) << "allowing TF32 changed nothing: the GEMM still rounds like float32";
  EXPECT_LE(fp32, fp32_bound);
}

}  // namespace
}  // namespace dtrain
