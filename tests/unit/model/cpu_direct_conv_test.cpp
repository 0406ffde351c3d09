// The direct 3x3 kernels of model/cpu_direct_conv.h (Note [Direct CPU convolution]) against
// convolution loops in double: forward with and without bias and fused ReLU, the weight, bias
// and input gradients written and accumulated, over odd sizes, strides 1 and 2, channel counts
// that fill no register tile, one and several images per chunk, and every build (AVX-512, AVX2, SSE2) this
// CPU runs; and the shapes they decline, which stay on im2col + GEMM.
#include "model/cpu_direct_conv.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "conv3x3_reference.h"
#include "gradcheck.h"

namespace dtrain {
namespace {

using testing::random_values;
using testing::Case;
using testing::geometry3x3;
using testing::Reference;
using testing::reference;

// |got - want| within float rounding of sums of `scale` in magnitude.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& scale,
                  double times, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], times * want[i], times * (2e-6 * scale[i] + 1e-6)) << what << " [" << i << "]";
}

const std::vector<Case> kCases = {
    {3, 3, 16, 28, 28},   // ResNet's stem at width 16
    {2, 16, 16, 28, 28},  // its layer1
    {2, 5, 7, 15, 17},    // odd sizes; channels that fill no tile
    {3, 64, 33, 28, 28},  // one image per chunk (three chunks); out_c odd
    {1, 1, 1, 14, 30},    // one channel, one image
    {2, 2, 9, 1, 20},     // a single row
    {5, 32, 32, 14, 14},  // layer2
    {9, 64, 64, 7, 7},    // layer3 (several images per chunk)
    {7, 128, 128, 4, 4},  // layer4
    {3, 6, 11, 5, 4},     // the narrowest plane taken, odd height
    {40, 3, 5, 6, 9},     // many images stacked in one chunk
    {60, 96, 101, 4, 4},  // chunks of 26 images and a short last one
    {2, 16, 32, 28, 28, 2},  // stride 2: ResNet's layer2.0.conv1 at width 16
    {3, 32, 64, 14, 14, 2},  // layer3.0.conv1 (7x7 out of 14x14)
    {4, 64, 128, 7, 7, 2},   // layer4.0.conv1: an odd input, 4x4 out
    {3, 5, 7, 9, 13, 2},     // odd sizes both ways (5x7 out)
    {2, 3, 4, 8, 10, 2},     // even sizes (4x5 out)
    {70, 40, 50, 9, 8, 2},   // several chunks (5x4 out)
};

class DirectConvIsa : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!cpu::select_direct_conv_isa(GetParam())) GTEST_SKIP() << "this CPU has no " << GetParam();
  }
  void TearDown() override { cpu::select_direct_conv_isa(""); }
};

TEST_P(DirectConvIsa, EqualsConvolutionLoops) {
  for (const Case& t : kCases)
    for (int variant = 0; variant < 2; ++variant) {  // 0: no bias, no ReLU; 1: bias and fused ReLU
      const bool bias = variant == 1, relu = variant == 1;
      const std::string what = fmt::format("{} batch {} in {} out {} {}x{} stride {} bias/relu {}", GetParam(),
                                           t.batch, t.in_c, t.out_c, t.h, t.w, t.stride, variant);
      const kernels::ConvGeometry g = geometry3x3(t.in_c, t.h, t.w, t.stride);
      ASSERT_TRUE(cpu::direct_conv_fits(g)) << what;
      const cpu::DirectConv d{g, t.batch, t.out_c};
      const std::vector<float> x = random_values(static_cast<size_t>(t.batch * t.in_c * t.h * t.w), 31);
      const std::vector<float> w = random_values(static_cast<size_t>(t.out_c * t.in_c * 9), 32);
      const std::vector<float> b = bias ? random_values(static_cast<size_t>(t.out_c), 33)
                                        : std::vector<float>(static_cast<size_t>(t.out_c), 0.f);
      std::vector<float> scratch(static_cast<size_t>(cpu::direct_conv_scratch_floats(d)), NAN);
      std::vector<float> y(static_cast<size_t>(t.batch * t.out_c * t.oh() * t.ow()), NAN);  // NaN: all must be written
      cpu::direct_conv_forward(d, x.data(), w.data(), bias ? b.data() : nullptr, relu, y.data(), scratch.data());
      const std::vector<float> dy = random_values(y.size(), 34);
      std::vector<float> dy_masked = dy;
      for (size_t i = 0; i < dy.size(); ++i)
        if (relu && !(y[i] > 0.f)) dy_masked[i] = 0.f;
      const Reference r = reference(t, x, w, b, dy_masked);
      std::vector<double> want_y = r.y;
      if (relu)
        for (double& v : want_y) v = std::max(v, 0.0);
      expect_close(y, want_y, r.y_abs, 1.0, what + " y");
      // Pass 1 overwrites NaN (stale memory), pass 2 accumulates onto pass 1.
      std::vector<float> dx(x.size(), NAN), dw(w.size(), NAN), db(b.size(), NAN);
      for (int pass = 1; pass <= 2; ++pass) {
        const float beta = pass == 1 ? 0.f : 1.f;
        cpu::direct_conv_backward(d, x.data(), w.data(), dy.data(), relu ? y.data() : nullptr, dx.data(), dw.data(),
                                  beta, bias ? db.data() : nullptr, beta, scratch.data());
        const std::string p = fmt::format("{} pass {}", what, pass);
        expect_close(dx, r.dx, r.dx_abs, 1.0, p + " dx");
        expect_close(dw, r.dw, r.dw_abs, pass, p + " dw");
        if (!bias) continue;
        for (size_t i = 0; i < db.size(); ++i) ASSERT_NEAR(db[i], pass * r.db[i], 1e-3) << p << " db[" << i << "]";
      }
      // Without the input gradient (no dx pointer): dw alone.
      std::vector<float> dw2(w.size(), NAN);
      cpu::direct_conv_backward(d, x.data(), w.data(), dy.data(), relu ? y.data() : nullptr, nullptr, dw2.data(), 0.f,
                                nullptr, 0.f, scratch.data());
      expect_close(dw2, r.dw, r.dw_abs, 1.0, what + " dw without dx");
    }
}

// The weight and bias gradients are sums over the batch image by image in its order (Note
// [Transposed weight gradient]): the batch at once and image by image, each call accumulating
// (beta 1) onto the last, give the same bits, so a run's bits never depend on the chunking.
TEST_P(DirectConvIsa, GradientBitsDoNotDependOnTheChunking) {
  for (const Case& t : {Case{37, 16, 16, 28, 28}, Case{23, 64, 64, 7, 7}, Case{30, 128, 128, 4, 4},
                        Case{13, 32, 64, 14, 14, 2}}) {
    const kernels::ConvGeometry g = geometry3x3(t.in_c, t.h, t.w, t.stride);
    const cpu::DirectConv all{g, t.batch, t.out_c}, one{g, 1, t.out_c};
    const int64_t in_size = t.in_c * t.h * t.w, out_size = t.out_c * t.oh() * t.ow();
    const std::vector<float> x = random_values(static_cast<size_t>(t.batch * in_size), 36);
    const std::vector<float> w = random_values(static_cast<size_t>(t.out_c * t.in_c * 9), 37);
    const std::vector<float> dy = random_values(static_cast<size_t>(t.batch * out_size), 38);
    std::vector<float> y(dy.size());  // the fused ReLU's mask
    std::vector<float> scratch(static_cast<size_t>(cpu::direct_conv_scratch_floats(all)));
    cpu::direct_conv_forward(all, x.data(), w.data(), nullptr, true, y.data(), scratch.data());
    std::vector<float> dw(w.size()), db(static_cast<size_t>(t.out_c)), dw1(w.size()), db1(db.size());
    cpu::direct_conv_backward(all, x.data(), w.data(), dy.data(), y.data(), nullptr, dw.data(), 0.f, db.data(), 0.f,
                              scratch.data());
    for (int64_t n = 0; n < t.batch; ++n) {
      const float beta = n == 0 ? 0.f : 1.f;
      cpu::direct_conv_backward(one, x.data() + n * in_size, w.data(), dy.data() + n * out_size,
                                y.data() + n * out_size, nullptr, dw1.data(), beta, db1.data(), beta, scratch.data());
    }
    for (size_t i = 0; i < dw.size(); ++i) ASSERT_EQ(dw1[i], dw[i]) << t.in_c << "->" << t.out_c << " dw " << i;
    for (size_t i = 0; i < db.size(); ++i) ASSERT_EQ(db1[i], db[i]) << t.in_c << "->" << t.out_c << " db " << i;
  }
}

// A batch of 0 writes zero gradients (beta 0), as the GEMM path's whole-batch GEMMs do.
TEST_P(DirectConvIsa, EmptyBatchWritesZeroGradients) {
  const cpu::DirectConv d{geometry3x3(2, 16, 16), 0, 3};
  std::vector<float> scratch(static_cast<size_t>(cpu::direct_conv_scratch_floats(d)));
  const std::vector<float> w = random_values(2 * 3 * 9, 35);
  std::vector<float> dw(w.size(), NAN), db(3, NAN);
  cpu::direct_conv_backward(d, nullptr, w.data(), nullptr, nullptr, nullptr, dw.data(), 0.f, db.data(), 0.f,
                            scratch.data());
  for (float v : dw) EXPECT_EQ(v, 0.f);
  for (float v : db) EXPECT_EQ(v, 0.f);
}

INSTANTIATE_TEST_SUITE_P(Builds, DirectConvIsa, ::testing::Values("avx512", "avx2", "generic"));

// Only 3x3, padding 1, stride 1 or 2, outputs at least kDirectConvMinWidth wide; everything else
// (ResNet's 1x1 downsampling) stays on im2col + GEMM.
TEST(DirectConv, FitsOnlyThreeByThreePaddingOneStrideOneOrTwo) {
  EXPECT_TRUE(cpu::direct_conv_fits(geometry3x3(16, 28, 28)));
  EXPECT_TRUE(cpu::direct_conv_fits(geometry3x3(1, 1, cpu::kDirectConvMinWidth)));
  EXPECT_TRUE(cpu::direct_conv_fits(geometry3x3(128, 4, 4)));
  EXPECT_FALSE(cpu::direct_conv_fits(geometry3x3(1, 28, cpu::kDirectConvMinWidth - 1)));
  EXPECT_TRUE(cpu::direct_conv_fits(geometry3x3(16, 28, 28, 2)));
  EXPECT_TRUE(cpu::direct_conv_fits(geometry3x3(64, 7, 7, 2)));  // 4x4 out
  EXPECT_FALSE(cpu::direct_conv_fits(geometry3x3(64, 5, 5, 2)));  // 3x3 out
  EXPECT_FALSE(cpu::direct_conv_fits({16, 28, 28, 3, 3, 3, 1, 10, 10}));  // stride 3
  EXPECT_FALSE(cpu::direct_conv_fits({16, 28, 28, 1, 1, 2, 0, 14, 14}));  // ResNet's 1x1 downsampling
  EXPECT_FALSE(cpu::direct_conv_fits({16, 28, 28, 1, 1, 1, 0, 28, 28}));  // 1x1
  EXPECT_FALSE(cpu::direct_conv_fits({16, 28, 28, 3, 3, 1, 0, 26, 26}));  // no padding
  EXPECT_FALSE(cpu::direct_conv_fits({16, 28, 28, 5, 5, 1, 2, 28, 28}));  // 5x5
}

}  // namespace
}  // namespace dtrain
