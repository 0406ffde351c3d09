// Tensor handles, views, copies and the 16-bit conversions the compression hooks rely on.
#include <cmath>
#include <limits>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"

#include "core/kernels.h"
#include "core/tensor.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;

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

// The error a call throws ("" when none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A wrapped element count sizes a buffer smaller than what is written into it: the issue's
// batch of 4611686018427387905 images of 28x28 wrapped to 784 elements.
TEST(Tensor, ShapeNumelRefusesOverflowNamingTheShape) {
  const Shape wraps = {4611686018427387905, 1, 28, 28};
  const std::string msg = error_of([&] { shape_numel(wraps); });
  EXPECT_EQ(msg, "shape [4611686018427387905, 1, 28, 28] has more elements than a 64-bit count holds");
  EXPECT_EQ(shape_numel({int64_t{1} << 31, int64_t{1} << 31}), int64_t{1} << 62);
  EXPECT_EQ(shape_numel({0, int64_t{1} << 62, int64_t{1} << 62}), 0);
  EXPECT_EQ(error_of([] { checked_mul(int64_t{1} << 32, int64_t{1} << 32, "batch columns"); }),
            "batch columns: 4294967296 x 4294967296 overflows 64 bits");
  EXPECT_EQ(checked_mul(3, 5, "x"), 15);
}

TEST(Tensor, EmptyRefusesSizesBeyondSixtyFourBitsBeforeAllocating) {
  EXPECT_THAT(error_of([] { Tensor::empty({4611686018427387905, 1, 28, 28}); }), HasSubstr("has more elements"));
  // 2^62 floats is a valid count but 2^64 bytes.
  EXPECT_EQ(error_of([] { Tensor::empty({int64_t{1} << 62}); }),
            "a float32 tensor of shape [4611686018427387904] needs more bytes than a 64-bit size holds");
  EXPECT_THAT(error_of([] { Tensor::zeros({int64_t{1} << 40, int64_t{1} << 22}, Device::cpu(), DType::kBF16); }),
              HasSubstr("needs more bytes than a 64-bit size holds"));
  EXPECT_THAT(error_of([] { Tensor::empty({2, -3}); }), HasSubstr("negative dimension in shape [2, -3]"));
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

// The padded layouts' copies (Note [Padded logits] in model/embedding.cpp): the rows land at the
// new stride and the pad columns are zero, whatever the buffer held.
TEST(PaddedRows, CopyAndPackWriteTheRowsAndZeroThePad) {
  const int64_t rows = 3, cols = 5, ld = 8;
  std::vector<float> src(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < src.size(); ++i) src[i] = 0.25f * static_cast<float>(i) - 1.f;
  std::vector<float> wide(static_cast<size_t>(rows * ld), std::nanf(""));
  std::vector<uint16_t> packed(static_cast<size_t>(rows * ld), 0x7fc0);  // bf16 NaN
  launch_rows(Device::cpu(), rows, kernels::CopyRows{wide.data(), src.data(), cols, ld, cols});
  launch_rows(Device::cpu(), rows, kernels::PackRowsHalf{packed.data(), src.data(), cols, ld, false});
  std::vector<float> back(static_cast<size_t>(rows * cols), std::nanf(""));
  launch_rows(Device::cpu(), rows, kernels::CopyRows{back.data(), wide.data(), cols, cols, ld});
  EXPECT_EQ(back, src);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < ld; ++c) {
      const size_t at = static_cast<size_t>(r * ld + c);
      const float want = c < cols ? src[static_cast<size_t>(r * cols + c)] : 0.f;
      EXPECT_EQ(wide[at], want) << r << "," << c;
      EXPECT_EQ(packed[at], kernels::float_to_bf16(want)) << r << "," << c;
    }
}

}  // namespace
}  // namespace dtrain
