// cuBLAS 16-bit GEMM (GemmEx on bf16 or fp16, float32 accumulation) against the CPU gemm_half
// for the row-major contract of core/ops.h: both formats, every transpose combination, odd
// sizes, alpha/beta.
#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "core/kernels.h"
#include "core/memory.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "tests/gpu/gpu_test.h"

namespace dtrain {
namespace {

using testing::GpuTest;

std::vector<uint16_t> random_half(DType half, size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v) x = half == DType::kF16 ? kernels::float_to_fp16(dist(rng)) : kernels::float_to_bf16(dist(rng));
  return v;
}

Tensor half_on_gpu(DType half, const std::vector<uint16_t>& words, const Shape& shape) {
  Tensor t = Tensor::empty(shape, Device::cuda(0), half);
  copy_bytes(t.raw(), Device::cuda(0), words.data(), Device::cpu(), t.nbytes());
  return t;
}

// C = alpha op(A) op(B) + beta C with 16-bit A, B on both devices; returns the largest |gpu - cpu|.
float max_difference(DType half, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, float beta,
                     unsigned seed) {
  const std::vector<uint16_t> a = random_half(half, static_cast<size_t>(m * k), seed);
  const std::vector<uint16_t> b = random_half(half, static_cast<size_t>(k * n), seed + 1);
  std::vector<float> c(static_cast<size_t>(m * n));
  std::mt19937 rng(seed + 2);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& x : c) x = dist(rng);
  Tensor ga = half_on_gpu(half, a, {ta ? k : m, ta ? m : k});
  Tensor gb = half_on_gpu(half, b, {tb ? n : k, tb ? k : n});
  Tensor gc = Tensor::from_vector(c, {m, n}, Device::cuda(0));
  gemm_half(Device::cuda(0), half, ta, tb, m, n, k, alpha, ga.data_as<uint16_t>(), gb.data_as<uint16_t>(), beta,
            gc.data());
  gemm_half(Device::cpu(), half, ta, tb, m, n, k, alpha, a.data(), b.data(), beta, c.data());
  const std::vector<float> got = gc.to_vector();
  float worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - c[i]));
  return worst;
}

class GpuGemmHalf : public GpuTest, public ::testing::WithParamInterface<std::tuple<DType, bool, bool>> {};

TEST_P(GpuGemmHalf, MatchesCpuGemmForOddSizes) {
  const auto [half, ta, tb] = GetParam();
  const int64_t sizes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 65}, {128, 64, 96}, {257, 129, 300}, {64, 784, 256}};
  unsigned seed = 1;
  for (const auto& s : sizes) {
    const int64_t m = s[0], n = s[1], k = s[2];
    // The products of 16-bit values are exact in float32 on both sides; only the summation
    // differs (order, and tensor cores' block-wise adds may round a little more than float32
    // steps): allow 1e-5 per term. A wrong transpose or leading dimension is off by O(1).
    const float tol = 1e-5f * static_cast<float>(k) + 1e-5f;
    EXPECT_LE(max_difference(half, ta, tb, m, n, k, 0.7f, 0.3f, seed++), tol)
        << "m=" << m << " n=" << n << " k=" << k << " trans_a=" << ta << " trans_b=" << tb;
    EXPECT_LE(max_difference(half, ta, tb, m, n, k, 1.0f, 0.0f, seed++), tol) << "beta = 0";
  }
}

INSTANTIATE_TEST_SUITE_P(FormatsAndTransposes, GpuGemmHalf,
                         ::testing::Combine(::testing::Values(DType::kBF16, DType::kF16), ::testing::Bool(),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == DType::kF16 ? "Fp16" : "Bf16") +
                                  (std::get<1>(info.param) ? "At" : "A") + (std::get<2>(info.param) ? "Bt" : "B");
                         });

}  // namespace
}  // namespace dtrain
