// The Winograd kernels of model/cpu_winograd_conv.h (Note [Winograd CPU convolution]) against
// convolution loops in double, F(2x2) and F(4x4), forward with and without bias and fused ReLU and
// the input gradient with and without the ReLU mask, on every ResNet-18 stride-1 shape at width 16,
// odd sizes (7x7, 5x9), channel counts that fill no register tile, batches that leave a short
// last chunk or block, and every build this CPU runs; the results do not depend on the chunking.
#include "model/cpu_winograd_conv.h"

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

// Note [Winograd test tolerance]: a direct sum's error is below eps * sum |terms| (~6e-8 of the
// scale per add; 2e-6 covers sums of a few hundred terms). Winograd's transforms add and
// subtract terms scaled by their coefficients before and after the products, so the rounding
// grows with the transforms' norms: measured here (random values in [-1, 1], every shape and
// build below) the worst |error| / scale was 2.6e-7 for F(2x2) and 4.5e-6 for F(4x4). The
// bounds leave a factor of 8 and 4 over that: 2e-6 (the direct kernels' own bound) and 2e-5.
double tolerance(int m) { return m == 2 ? 2e-6 : 2e-5; }

void expect_close(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& scale,
                  double rel, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], rel * scale[i] + 1e-6) << what << " [" << i << "]";
}

const std::vector<Case> kCases = {
    {2, 16, 16, 28, 28},  // ResNet-18's layer1 at width 16
    {5, 32, 32, 14, 14},  // layer2
    {9, 64, 64, 7, 7},    // layer3: odd, tiles past the edge
    {7, 128, 128, 4, 4},  // layer4
    {3, 3, 16, 28, 28},   // the stem
    {2, 5, 7, 5, 9},      // odd sizes both ways; channels that fill no tile
    {1, 1, 1, 1, 1},      // one pixel
    {3, 64, 33, 28, 28},  // one image per chunk; out_c odd
    {65, 16, 16, 7, 7},   // a batch remainder: chunks with a short last one
    {11, 9, 20, 6, 3},    // narrow
};

class WinogradConvIsa : public ::testing::TestWithParam<std::tuple<const char*, int>> {
 protected:
  void SetUp() override {
    if (!cpu::select_winograd_conv_isa(std::get<0>(GetParam())))
      GTEST_SKIP() << "this CPU has no " << std::get<0>(GetParam());
  }
  void TearDown() override { cpu::select_winograd_conv_isa(""); }
};

TEST_P(WinogradConvIsa, EqualsConvolutionLoops) {
  const auto [isa, m] = GetParam();
  for (const Case& t : kCases)
    for (int variant = 0; variant < 2; ++variant) {  // 0: no bias, no ReLU; 1: bias and fused ReLU
      const bool bias = variant == 1, relu = variant == 1;
      const std::string what = fmt::format("{} F({}) batch {} in {} out {} {}x{} bias/relu {}", isa, m, t.batch,
                                           t.in_c, t.out_c, t.h, t.w, variant);
      const kernels::ConvGeometry g = geometry3x3(t.in_c, t.h, t.w);
      ASSERT_TRUE(cpu::winograd_fits(g)) << what;
      const cpu::WinogradConv d{g, t.batch, t.out_c, m};
      const std::vector<float> x = random_values(static_cast<size_t>(t.batch * t.in_c * t.h * t.w), 41);
      const std::vector<float> w = random_values(static_cast<size_t>(t.out_c * t.in_c * 9), 42);
      const std::vector<float> b = bias ? random_values(static_cast<size_t>(t.out_c), 43)
                                        : std::vector<float>(static_cast<size_t>(t.out_c), 0.f);
      std::vector<float> scratch(static_cast<size_t>(cpu::winograd_conv_scratch_floats(d)), NAN);
      std::vector<float> y(static_cast<size_t>(t.batch * t.out_c * t.h * t.w), NAN);  // NaN: all must be written
      cpu::winograd_conv_forward(d, x.data(), w.data(), bias ? b.data() : nullptr, relu, y.data(), scratch.data());
      const std::vector<float> dy = random_values(y.size(), 44);
      std::vector<float> dy_masked = dy;
      for (size_t i = 0; i < dy.size(); ++i)
        if (relu && !(y[i] > 0.f)) dy_masked[i] = 0.f;
      const Reference r = reference(t, x, w, b, dy_masked);
      std::vector<double> want_y = r.y;
      if (relu)
        for (double& v : want_y) v = std::max(v, 0.0);
      expect_close(y, want_y, r.y_abs, tolerance(m), what + " y");
      std::vector<float> dx(x.size(), NAN);
      cpu::winograd_conv_input_grad(d, w.data(), dy.data(), relu ? y.data() : nullptr, dx.data(), scratch.data());
      expect_close(dx, r.dx, r.dx_abs, tolerance(m), what + " dx");
    }
}

// Every output is the same operations whatever its chunk or lane: the batch run at once and
// image by image give the same bits (a run's bits never depend on how the batch is cut).
TEST_P(WinogradConvIsa, BitsDoNotDependOnTheChunking) {
  const int m = std::get<1>(GetParam());
  for (const Case& t : {Case{37, 16, 16, 28, 28}, Case{23, 64, 64, 7, 7}}) {
    const kernels::ConvGeometry g = geometry3x3(t.in_c, t.h, t.w);
    const cpu::WinogradConv all{g, t.batch, t.out_c, m}, one{g, 1, t.out_c, m};
    const int64_t in_size = t.in_c * t.h * t.w, out_size = t.out_c * t.h * t.w;
    const std::vector<float> x = random_values(static_cast<size_t>(t.batch * in_size), 45);
    const std::vector<float> w = random_values(static_cast<size_t>(t.out_c * t.in_c * 9), 46);
    const std::vector<float> dy = random_values(static_cast<size_t>(t.batch * out_size), 47);
    std::vector<float> scratch(static_cast<size_t>(cpu::winograd_conv_scratch_floats(all)));
    std::vector<float> y(dy.size()), dx(x.size()), y1(static_cast<size_t>(out_size)), dx1(static_cast<size_t>(in_size));
    cpu::winograd_conv_forward(all, x.data(), w.data(), nullptr, false, y.data(), scratch.data());
    cpu::winograd_conv_input_grad(all, w.data(), dy.data(), nullptr, dx.data(), scratch.data());
    for (int64_t n = 0; n < t.batch; ++n) {
      cpu::winograd_conv_forward(one, x.data() + n * in_size, w.data(), nullptr, false, y1.data(), scratch.data());
      cpu::winograd_conv_input_grad(one, w.data(), dy.data() + n * out_size, nullptr, dx1.data(), scratch.data());
      for (int64_t i = 0; i < out_size; ++i) ASSERT_EQ(y1[i], y[n * out_size + i]) << "image " << n << " y " << i;
      for (int64_t i = 0; i < in_size; ++i) ASSERT_EQ(dx1[i], dx[n * in_size + i]) << "image " << n << " dx " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Builds, WinogradConvIsa,
                         ::testing::Combine(::testing::Values("avx512", "avx2", "generic"), ::testing::Values(2, 4)));

TEST(WinogradConv, FitsOnlyThreeByThreeStrideOnePaddingOne) {
  EXPECT_TRUE(cpu::winograd_fits(geometry3x3(16, 28, 28)));
  EXPECT_TRUE(cpu::winograd_fits(geometry3x3(64, 7, 7)));
  EXPECT_FALSE(cpu::winograd_fits({16, 28, 28, 3, 3, 2, 1, 14, 14}));  // stride 2
  EXPECT_FALSE(cpu::winograd_fits({16, 28, 28, 1, 1, 1, 0, 28, 28}));  // 1x1
  EXPECT_FALSE(cpu::winograd_fits({16, 28, 28, 3, 3, 1, 0, 26, 26}));  // no padding
  EXPECT_FALSE(cpu::winograd_fits({16, 28, 28, 5, 5, 1, 2, 28, 28}));  // 5x5
}

}  // namespace
}  // namespace dtrain
