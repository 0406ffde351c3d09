// fp16 (and Conv2d's bf16) mixed precision: the CPU's rounding to IEEE half equals the
// compiler's _Float16 conversion on every class of float (overflow to infinity above 65504,
// subnormals, ties to even, NaN); gemm_half(kF16) is the float32 GEMM of fp16-rounded operands;
// Linear and Conv2d under fp16/bf16 are exactly "round the operands, accumulate in float32".
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "core/kernels.h"
#include "core/ops.h"
#include "gradcheck.h"
#include "model/conv.h"
#include "model/linear.h"

namespace dtrain {
namespace {

using kernels::float_to_fp16;
using kernels::fp16_to_float;
using testing::random_values;

float round_to(DType half, float v) {
  return half == DType::kF16 ? fp16_to_float(float_to_fp16(v)) : kernels::bf16_to_float(kernels::float_to_bf16(v));
}

std::vector<float> rounded(DType half, std::vector<float> v) {
  for (float& x : v) x = round_to(half, x);
  return v;
}

std::vector<uint16_t> packed(DType half, const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    out[i] = half == DType::kF16 ? float_to_fp16(v[i]) : kernels::float_to_bf16(v[i]);
  return out;
}

TEST(Fp16Rounding, OverflowSubnormalsAndTies) {
  EXPECT_EQ(float_to_fp16(65504.f), 0x7bffu) << "the largest half";
  EXPECT_EQ(float_to_fp16(65519.99f), 0x7bffu) << "below the midpoint to 65536: rounds down";
  EXPECT_EQ(float_to_fp16(65520.f), 0x7c00u) << "the midpoint rounds to even: infinity";
  EXPECT_EQ(float_to_fp16(1e6f), 0x7c00u);
  EXPECT_EQ(float_to_fp16(-1e6f), 0xfc00u);
  EXPECT_TRUE(std::isinf(fp16_to_float(float_to_fp16(70000.f))));
  EXPECT_EQ(float_to_fp16(std::ldexp(1.f, -14)), 0x0400u) << "the smallest normal";
  EXPECT_EQ(float_to_fp16(std::ldexp(1.f, -24)), 0x0001u) << "the smallest subnormal";
  EXPECT_EQ(float_to_fp16(std::ldexp(1.f, -25)), 0x0000u) << "half of it: a tie, to even (zero)";
  EXPECT_EQ(float_to_fp16(std::ldexp(3.f, -26)), 0x0001u) << "above the tie: up";
  EXPECT_EQ(float_to_fp16(std::ldexp(3.f, -25)), 0x0002u) << "1.5 x 2^-24: a tie, to even (2)";
  EXPECT_EQ(float_to_fp16(-std::ldexp(1.f, -30)), 0x8000u) << "signed zero";
  EXPECT_EQ(float_to_fp16(1.f + std::ldexp(1.f, -11)), 0x3c00u) << "1 + half an ulp: to even";
  EXPECT_EQ(float_to_fp16(1.f + std::ldexp(3.f, -11)), 0x3c02u) << "1 + 1.5 ulp: to even";
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(std::nanf("")))));
  EXPECT_EQ(fp16_to_float(0x0001u), std::ldexp(1.f, -24));
  EXPECT_EQ(fp16_to_float(0x03ffu), std::ldexp(1023.f, -24)) << "the largest subnormal";
}

#if defined(__FLT16_MAX__)
uint16_t ieee_half_bits(float v) {
  const _Float16 h = static_cast<_Float16>(v);
  uint16_t bits;
  std::memcpy(&bits, &h, sizeof bits);
  return bits;
}

TEST(Fp16Rounding, EqualsIeeeHalfConversion) {
  // Every 65521st float bit pattern (65,550 values over all exponents and both signs), and every
  // half value's neighbours and midpoints: the round-to-nearest-even decisions.
  std::vector<float> values;
  for (uint64_t u = 0; u <= 0xffffffffull; u += 65521) values.push_back(kernels::bits_float(static_cast<uint32_t>(u)));
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    const float a = fp16_to_float(static_cast<uint16_t>(h)), b = fp16_to_float(static_cast<uint16_t>(h + 1));
    const float mid = a + (b - a) / 2;  // exact: one more bit than half
    for (float v : {a, mid, std::nextafter(mid, 0.f), std::nextafter(mid, 1e30f)}) {
      values.push_back(v);
      values.push_back(-v);
    }
  }
  int64_t mismatches = 0;
  for (float v : values) {
    const uint16_t got = float_to_fp16(v), want = ieee_half_bits(v);
    const bool both_nan = std::isnan(v) && (got & 0x7c00u) == 0x7c00u && (got & 0x3ffu) != 0;
    if (got != want && !both_nan && ++mismatches < 5) ADD_FAILURE() << v << ": got " << got << ", IEEE " << want;
  }
  EXPECT_EQ(mismatches, 0) << "of " << values.size();
}
#else
TEST(Fp16Rounding, EqualsIeeeHalfConversion) { GTEST_SKIP() << "this compiler has no _Float16"; }
#endif

TEST(PackHalf, Fp16OverflowsToInfinityOnTheDevicePath) {
  const Tensor src = Tensor::from_vector(std::vector<float>{1.f, 65504.f, 65520.f, -1e5f, 1e-8f}, {5});
  Tensor dst;
  pack_half(DType::kF16, src, dst);
  ASSERT_EQ(dst.dtype(), DType::kF16);
  const uint16_t* h = dst.data_as<uint16_t>();
  EXPECT_EQ(h[0], 0x3c00u);
  EXPECT_EQ(h[1], 0x7bffu);
  EXPECT_EQ(h[2], 0x7c00u);
  EXPECT_EQ(h[3], 0xfc00u);
  EXPECT_EQ(h[4], float_to_fp16(1e-8f));
}

class GemmFp16 : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(GemmFp16, IsTheFloatGemmOfRoundedOperands) {
  const auto [ta, tb] = GetParam();
  const int64_t sizes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 65}, {64, 10, 256}};
  uint32_t seed = 3;
  for (const auto& s : sizes) {
    const int64_t m = s[0], n = s[1], k = s[2];
    const std::vector<float> a = random_values(static_cast<size_t>(m * k), seed++, -4.f, 4.f);
    const std::vector<float> b = random_values(static_cast<size_t>(k * n), seed++, -4.f, 4.f);
    const std::vector<float> c0 = random_values(static_cast<size_t>(m * n), seed++);
    const std::vector<float> ra = rounded(DType::kF16, a), rb = rounded(DType::kF16, b);
    std::vector<float> got = c0, want = c0;
    gemm_half(Device::cpu(), DType::kF16, ta, tb, m, n, k, 0.7f, packed(DType::kF16, a).data(),
              packed(DType::kF16, b).data(), 0.3f, got.data());
    gemm(Device::cpu(), ta, tb, m, n, k, 0.7f, ra.data(), rb.data(), 0.3f, want.data());
    EXPECT_EQ(got, want) << "m=" << m << " n=" << n << " k=" << k;
  }
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, GemmFp16, ::testing::Combine(::testing::Bool(), ::testing::Bool()));

TEST(LinearFp16, IsExactlyRoundedOperandsAndOverflowsLikeHalf) {
  constexpr int64_t kIn = 48, kOut = 20, kBatch = 6;
  InitRng rng_a{4}, rng_b{4};
  Linear amp(kIn, kOut, Device::cpu(), rng_a), plain(kIn, kOut, Device::cpu(), rng_b);
  amp.set_amp(AmpMode::kFp16);
  // The reference: a float32 Linear fed the fp16-rounded input and weight.
  Parameter& w = *plain.parameters()[0];
  w.value = Tensor::from_vector(rounded(DType::kF16, w.value.to_vector()), w.value.shape());
  std::vector<float> x = random_values(kBatch * kIn, 8, -3.f, 3.f);
  const std::vector<float> dy = random_values(kBatch * kOut, 9);
  const Tensor grad = Tensor::from_vector(dy, {kBatch, kOut});
  EXPECT_EQ(amp.forward(Tensor::from_vector(x, {kBatch, kIn})).to_vector(),
            plain.forward(Tensor::from_vector(rounded(DType::kF16, x), {kBatch, kIn})).to_vector());
  const std::vector<float> dx = amp.backward(grad).to_vector();
  const std::vector<float> dx_ref = plain.backward(Tensor::from_vector(rounded(DType::kF16, dy), {kBatch, kOut})).to_vector();
  EXPECT_EQ(dx, dx_ref);
  EXPECT_EQ(amp.parameters()[0]->grad.to_vector(), plain.parameters()[0]->grad.to_vector());
  // An activation beyond fp16's range is infinite in the GEMM, as on a GPU.
  x[0] = 1e5f;
  const std::vector<float> y = amp.forward(Tensor::from_vector(x, {kBatch, kIn})).to_vector();
  bool inf_in_row0 = false;
  for (int64_t o = 0; o < kOut; ++o) inf_in_row0 |= !std::isfinite(y[static_cast<size_t>(o)]);
  EXPECT_TRUE(inf_in_row0);
}

class ConvHalf : public ::testing::TestWithParam<DType> {};

TEST_P(ConvHalf, IsExactlyRoundedOperandsWithFloatAccumulation) {
  const DType half = GetParam();
  // 5x5: float32's 3x3 padding-1 convolutions take the direct kernels (Note [Direct CPU
  // convolution]), whose sums are not the GEMM's that the 16-bit path shares with im2col.
  const int64_t batch = 2, in_c = 3, out_c = 4, k = 5, pad = 2, h = 7, w = 6;
  InitRng rng_a{6}, rng_b{6};
  Conv2d amp(in_c, out_c, k, 1, pad, Device::cpu(), rng_a), plain(in_c, out_c, k, 1, pad, Device::cpu(), rng_b);
  amp.set_amp(half == DType::kF16 ? AmpMode::kFp16 : AmpMode::kBf16);
  Parameter& wp = *plain.parameters()[0];
  wp.value = Tensor::from_vector(rounded(half, wp.value.to_vector()), wp.value.shape());
  const std::vector<float> x = random_values(static_cast<size_t>(batch * in_c * h * w), 12, -2.f, 2.f);
  const Shape xs{batch, in_c, h, w};
  const std::vector<float> y = amp.forward(Tensor::from_vector(x, xs)).to_vector();
  EXPECT_EQ(y, plain.forward(Tensor::from_vector(rounded(half, x), xs)).to_vector());
  const std::vector<float> dy = random_values(y.size(), 13);
  const Shape ys{batch, out_c, h, w};
  const std::vector<float> dx = amp.backward(Tensor::from_vector(dy, ys)).to_vector();
  EXPECT_EQ(dx, plain.backward(Tensor::from_vector(rounded(half, dy), ys)).to_vector());
  EXPECT_EQ(amp.parameters()[0]->grad.to_vector(), plain.parameters()[0]->grad.to_vector());
  // ...and the 16-bit path is really taken: the unrounded float32 conv differs.
  InitRng rng_c{6};
  Conv2d exact(in_c, out_c, k, 1, pad, Device::cpu(), rng_c);
  EXPECT_NE(y, exact.forward(Tensor::from_vector(x, xs)).to_vector());
}

INSTANTIATE_TEST_SUITE_P(Formats, ConvHalf, ::testing::Values(DType::kF16, DType::kBF16),
                         [](const auto& info) { return std::string(info.param == DType::kF16 ? "Fp16" : "Bf16"); });

}  // namespace
}  // namespace dtrain
