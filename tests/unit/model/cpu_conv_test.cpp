// The CPU loops of model/cpu_conv.h against the device-generic functors they stand in for
// (model/kernels.h, run here through launch() on the CPU): bitwise where the sums keep the
// reference's order, within float rounding for the bias gradient, over geometries with odd
// sizes, stride 2 and 3, padding, kernel 1, batch 1, and each of cpu_conv.cpp's paths (rows,
// flat taps, tabulated taps for im2col).
#include "model/cpu_conv.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "gradcheck.h"

namespace dtrain {
namespace {

using kernels::ConvGeometry;
using testing::random_values;

struct Case {
  int64_t batch, c, h, w, k, stride, pad;
};

ConvGeometry geometry(const Case& t) {
  ConvGeometry g{t.c, t.h, t.w, t.k, t.k, t.stride, t.pad, 0, 0};
  g.oh = (t.h + 2 * t.pad - t.k) / t.stride + 1;
  g.ow = (t.w + 2 * t.pad - t.k) / t.stride + 1;
  return g;
}

std::string describe(const Case& t) {
  return fmt::format("batch {} c {} {}x{} kernel {} stride {} pad {}", t.batch, t.c, t.h, t.w, t.k, t.stride, t.pad);
}

const std::vector<Case> kCases = {
    {2, 1, 28, 28, 5, 1, 2},  // the CNN's first convolution, batch 2
    {3, 6, 14, 14, 5, 1, 0},  // its second
    {1, 2, 7, 5, 3, 2, 1},    // odd sizes, stride 2, padding, batch 1
    {2, 3, 9, 6, 3, 2, 0},    // stride 2, no padding, odd height
    {2, 2, 8, 7, 5, 3, 2},    // stride 3, padding 2
    {1, 3, 5, 5, 1, 1, 0},    // kernel 1
    {2, 1, 4, 3, 3, 1, 2},    // padding wider than the image's reach at the edges
    {3, 2, 6, 5, 3, 1, 1},    // ResNet's 3x3 padding 1 on a small plane (tabulated taps)
    {1, 2, 4, 3, 7, 1, 3},    // the same with taps wholly in the padding
    {2, 2, 10, 9, 3, 1, 1},   // 3x3 padding 1 on a plane over 64 pixels (flat taps: one run per tap)
    {1, 1, 9, 8, 19, 1, 9},   // flat taps with some wholly in the padding
};

// Bitwise equality, so -0 vs +0 and NaN payloads would count (memcmp).
void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t wrong = 0, first = got.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && wrong++ == 0) first = i;
  EXPECT_EQ(wrong, 0u) << what << ": first at " << first << " got " << got[first] << " want " << want[first];
}

TEST(CpuConv, Im2colEqualsTheFunctorBitwise) {
  for (const Case& t : kCases) {
    const ConvGeometry g = geometry(t);
    const std::vector<float> x = random_values(static_cast<size_t>(t.batch * t.c * t.h * t.w), 1);
    const size_t n = static_cast<size_t>(t.c * t.k * t.k * t.batch * g.oh * g.ow);
    std::vector<float> want(n, NAN), got(n, NAN);  // NaN: every element must be written
    launch(Device::cpu(), static_cast<int64_t>(n), kernels::Im2col{want.data(), x.data(), g, t.batch});
    cpu::im2col(x.data(), g, t.batch, got.data());
    expect_bitwise(got, want, describe(t));
  }
}

TEST(CpuConv, Col2imEqualsTheFunctorBitwise) {
  for (const Case& t : kCases) {
    const ConvGeometry g = geometry(t);
    const std::vector<float> col = random_values(static_cast<size_t>(t.c * t.k * t.k * t.batch * g.oh * g.ow), 2);
    const size_t n = static_cast<size_t>(t.batch * t.c * t.h * t.w);
    std::vector<float> want(n, NAN), got(n, NAN), scratch = col;  // col2im may zero its padding taps
    launch(Device::cpu(), static_cast<int64_t>(n), kernels::Col2im{want.data(), col.data(), g, t.batch});
    cpu::col2im(scratch.data(), g, t.batch, got.data());
    expect_bitwise(got, want, describe(t));
  }
}

TEST(CpuConv, ColumnsToNchwWithBiasAndReluEqualsTheFunctorsBitwise) {
  for (bool relu : {false, true})
    for (const Case& t : kCases) {
      const ConvGeometry g = geometry(t);
      const int64_t channels = t.c + 2, plane = g.oh * g.ow, n = t.batch * channels * plane;
      const std::vector<float> yc = random_values(static_cast<size_t>(n), 3), b = random_values(channels, 4);
      std::vector<float> want(static_cast<size_t>(n), NAN), got(static_cast<size_t>(n), NAN);
      launch(Device::cpu(), n, kernels::ColumnsToNchwBias{want.data(), yc.data(), b.data(), t.batch, channels, plane});
      if (relu) launch(Device::cpu(), n, kernels::ReluForward{want.data(), want.data()});
      cpu::columns_to_nchw_bias(yc.data(), b.data(), t.batch, channels, plane, relu, got.data());
      expect_bitwise(got, want, describe(t) + (relu ? " relu" : ""));
    }
}

// The gradient's columns bitwise (masked by a ReLU output or not); the bias gradient within
// float rounding of the double-precision sum, overwriting or accumulating.
TEST(CpuConv, NchwToColumnsWithReluMaskAndBiasGradient) {
  for (bool relu : {false, true})
    for (float beta : {0.f, 1.f})
      for (const Case& t : kCases) {
        const ConvGeometry g = geometry(t);
        const int64_t channels = t.c + 1, plane = g.oh * g.ow, n = t.batch * channels * plane;
        const std::vector<float> dy = random_values(static_cast<size_t>(n), 5), y = random_values(static_cast<size_t>(n), 6);
        std::vector<float> masked = dy, want(static_cast<size_t>(n), NAN), got(static_cast<size_t>(n), NAN);
        if (relu) launch(Device::cpu(), n, kernels::ReluBackward{masked.data(), dy.data(), y.data()});
        launch(Device::cpu(), n, kernels::NchwToColumns{want.data(), masked.data(), t.batch, channels, plane});
        std::vector<float> db(static_cast<size_t>(channels), beta == 0.f ? NAN : 0.5f);  // NaN: stale memory
        cpu::nchw_to_columns(dy.data(), relu ? y.data() : nullptr, t.batch, channels, plane, got.data(), db.data(), beta);
        expect_bitwise(got, want, describe(t));
        for (int64_t c = 0; c < channels; ++c) {
          double sum = beta == 0.f ? 0.0 : 0.5;
          for (int64_t i = 0; i < t.batch * plane; ++i) sum += want[static_cast<size_t>(c * t.batch * plane + i)];
          EXPECT_NEAR(db[static_cast<size_t>(c)], sum, 1e-5 * (1.0 + static_cast<double>(t.batch * plane)))
              << describe(t) << " channel " << c;
        }
      }
}

// Pooling input with ties (values on a coarse grid) and a NaN, so the order of the tests matters.
std::vector<float> pooling_input(size_t n, uint32_t seed) {
  std::vector<float> x = random_values(n, seed);
  for (float& v : x) v = std::round(v * 3.f) / 3.f;
  if (n > 5) x[5] = NAN;
  return x;
}

const std::vector<Case> kPoolCases = {
    {2, 6, 28, 28, 2, 2, 0},  // the CNN's pools
    {2, 16, 10, 10, 2, 2, 0},
    {1, 2, 7, 5, 3, 2, 1},    // overlapping windows, padding, odd sizes, batch 1
    {2, 1, 9, 9, 3, 1, 1},    // stride 1: every input in up to 9 windows
    {1, 3, 5, 7, 2, 1, 0},
    {3, 1, 11, 21, 2, 2, 1},  // wide rows: blocks of 8 and a remainder
};

TEST(CpuConv, MaxPoolForwardEqualsTheFunctorBitwiseWithTiesAndNaN) {
  for (const Case& t : kPoolCases) {
    ConvGeometry g = geometry(t);
    const int64_t planes = t.batch * t.c, n_out = planes * g.oh * g.ow;
    const std::vector<float> x = pooling_input(static_cast<size_t>(planes * t.h * t.w), 7);
    std::vector<float> want(static_cast<size_t>(n_out), NAN), got(static_cast<size_t>(n_out), NAN);
    std::vector<int32_t> want_at(static_cast<size_t>(n_out), -7), got_at(static_cast<size_t>(n_out), -7);
    launch(Device::cpu(), n_out, kernels::MaxPoolForward{want.data(), want_at.data(), x.data(), g});
    cpu::maxpool_forward(x.data(), g, planes, got.data(), got_at.data());
    expect_bitwise(got, want, describe(t));
    EXPECT_EQ(got_at, want_at) << describe(t);
  }
}

TEST(CpuConv, MaxPoolBackwardEqualsTheFunctorBitwise) {
  for (const Case& t : kPoolCases) {
    ConvGeometry g = geometry(t);
    const int64_t planes = t.batch * t.c, n_out = planes * g.oh * g.ow, n_in = planes * t.h * t.w;
    const std::vector<float> x = pooling_input(static_cast<size_t>(n_in), 8);
    std::vector<float> y(static_cast<size_t>(n_out));
    std::vector<int32_t> at(static_cast<size_t>(n_out));
    launch(Device::cpu(), n_out, kernels::MaxPoolForward{y.data(), at.data(), x.data(), g});
    // Gradients of mixed magnitude: a different order of the adds would change the sums.
    std::vector<float> dy = random_values(static_cast<size_t>(n_out), 9);
    for (size_t i = 0; i < dy.size(); i += 3) dy[i] *= 1e4f;
    std::vector<float> want(static_cast<size_t>(n_in), NAN), got(static_cast<size_t>(n_in), NAN);
    launch(Device::cpu(), n_in, kernels::MaxPoolBackward{want.data(), dy.data(), at.data(), g});
    cpu::maxpool_backward(dy.data(), at.data(), g, planes, got.data());
    expect_bitwise(got, want, describe(t));
  }
}

}  // namespace
}  // namespace dtrain
