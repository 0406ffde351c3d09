// Tensor handles, views, copies and the 16-bit conversions the compression hooks rely on.
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "core/kernels.h"
#include "core/tensor.h"

namespace dtrain {
namespace {

TEST(Tensor, ViewsShareStorageCopiesDoNot) {
  Tensor t = Tensor::zeros({2, 3});
  Tensor v = t.slice(3, {3});
  v.data()[1] = 5.f;
  EXPECT_EQ(t.to_vector()[4], 5.f);
  Tensor c = t.to(Device::cpu());
  c.data()[0] = 1.f;
  EXPECT_EQ(t.to_vector()[0], 0.f);
  EXPECT_THROW(t.slice(4, {3}), Error);
  EXPECT_THROW(t.view({4}), Error);
}

TEST(Tensor, EnsureReallocatesOnlyOnShapeChange) {
  Tensor t;
  ensure_tensor(t, {4, 4}, Device::cpu());
  const void* first = t.raw();
  ensure_tensor(t, {4, 4}, Device::cpu());
  EXPECT_EQ(t.raw(), first);
  ensure_tensor(t, {2, 4}, Device::cpu());
  EXPECT_EQ(t.shape(), (Shape{2, 4}));
}

TEST(HalfPrecision, Bf16RoundsToNearestEven) {
  using namespace kernels;
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_float(float_to_bf16(3.140625f)), 3.140625f);           // exactly representable
  EXPECT_EQ(float_to_bf16(bits_float(0x3f808000u)), 0x3f80);               // tie -> even
  EXPECT_EQ(float_to_bf16(bits_float(0x3f818000u)), 0x3f82);               // tie -> even (up)
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  for (float x : {1e-3f, 0.1f, 1.f, 123.456f, -7.5e5f}) EXPECT_NEAR(bf16_to_float(float_to_bf16(x)), x, std::abs(x) / 256);
}

TEST(HalfPrecision, Fp16NormalsSubnormalsAndOverflow) {
  using namespace kernels;
  EXPECT_EQ(float_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_fp16(65504.f), 0x7bff);
  EXPECT_EQ(float_to_fp16(65520.f), 0x7c00);                               // rounds to inf
  EXPECT_EQ(float_to_fp16(5.9604645e-8f), 0x0001);                         // smallest subnormal
  EXPECT_EQ(float_to_fp16(1e-9f), 0x0000);
  EXPECT_EQ(fp16_to_float(0x0001), 5.9604645e-8f);
  EXPECT_EQ(fp16_to_float(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(std::nanf("")))));
  // Every 16-bit pattern that is not NaN survives a round trip exactly.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = fp16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(float_to_fp16(f), h) << std::hex << h;
  }
  for (float x : {1e-3f, 0.1f, 1.f, 123.456f, -3e4f}) EXPECT_NEAR(fp16_to_float(float_to_fp16(x)), x, std::abs(x) / 2048);
}

}  // namespace
}  // namespace dtrain
