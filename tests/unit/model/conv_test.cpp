// Conv2d against a direct convolution loop, and its scratch reuse across batch sizes.
#include <gtest/gtest.h>

#include <algorithm>

#include "gradcheck.h"
#include "core/error.h"
#include "model/conv.h"
#include "model/linear.h"

namespace dtrain {
namespace {

using testing::random_values;

// y[n, oc, oy, ox] = b[oc] + sum_{ci, ky, kx} w[oc, ci, ky, kx] x[n, ci, oy*s - p + ky, ox*s - p + kx],
// out-of-range taps reading zero; accumulated in double.
std::vector<float> direct_conv(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& b,
                               int64_t batch, int64_t in_c, int64_t h, int64_t wd, int64_t out_c, int64_t k,
                               int64_t s, int64_t p) {
  const int64_t oh = (h + 2 * p - k) / s + 1, ow = (wd + 2 * p - k) / s + 1;
  std::vector<float> y(static_cast<size_t>(batch * out_c * oh * ow));
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t oc = 0; oc < out_c; ++oc)
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          double acc = b[oc];
          for (int64_t ci = 0; ci < in_c; ++ci)
            for (int64_t ky = 0; ky < k; ++ky)
              for (int64_t kx = 0; kx < k; ++kx) {
                const int64_t iy = oy * s - p + ky, ix = ox * s - p + kx;
                if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                acc += static_cast<double>(w[((oc * in_c + ci) * k + ky) * k + kx]) *
                       x[((n * in_c + ci) * h + iy) * wd + ix];
              }
          y[((n * out_c + oc) * oh + oy) * ow + ox] = static_cast<float>(acc);
        }
  return y;
}

TEST(Conv2d, ForwardEqualsDirectConvolution) {
  const int64_t batch = 3, in_c = 2, out_c = 4, k = 3, s = 2, p = 1, h = 7, w = 6;
  InitRng rng(11);
  Conv2d layer(in_c, out_c, k, s, p, Device::cpu(), rng);
  std::vector<float> x = random_values(static_cast<size_t>(batch * in_c * h * w), 12);
  Tensor y = layer.forward(Tensor::from_vector(x, {batch, in_c, h, w}));
  ASSERT_EQ(y.shape(), (Shape{batch, out_c, 4, 3}));
  std::vector<float> expected = direct_conv(x, layer.parameters()[0]->value.to_vector(),
                                            layer.parameters()[1]->value.to_vector(), batch, in_c, h, w, out_c, k, s, p);
  std::vector<float> got = y.to_vector();
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-5f) << "y[" << i << "]";
}

// Note [Chunked CPU convolution]: batches that span several chunks, against the direct loops in
// double: one image per chunk (columns over 512 KB: the GEMM writes the output, and dY is used
// in place when there is no bias or ReLU) and several per chunk with a short last one (9 = 6 +
// 3), with and without bias and a fused ReLU; the gradients written, then accumulated. 5x5
// kernels: ResNet's 3x3 padding 1 takes the direct kernels (Note [Direct CPU convolution]),
// which the 3x3 cases check through Conv2d the same way, and 64 to 64 channels at 7x7 the
// Winograd kernels' (Note [Winograd CPU convolution]).
TEST(Conv2d, CpuPathsEqualDirectLoops) {
  struct Case {
    int64_t batch, in_c, out_c, hw, k;
    bool bias, relu;
  };
  for (const Case& t : {Case{3, 16, 4, 28, 5, false, false}, Case{3, 16, 4, 28, 5, true, true},
                        Case{9, 16, 3, 7, 5, false, false}, Case{9, 16, 3, 7, 5, true, true},
                        Case{3, 16, 4, 28, 3, false, false}, Case{9, 64, 3, 7, 3, true, true},
                        Case{5, 64, 64, 7, 3, true, true}}) {  // Winograd forward and dX (winograd_tile)
    const int64_t k = t.k, pad = (k - 1) / 2, plane = t.hw * t.hw, in_plane = plane;
    InitRng rng(21);
    Conv2d layer(t.in_c, t.out_c, k, 1, pad, Device::cpu(), rng, t.bias);
    if (t.relu) layer.absorb_following_relu();
    const std::vector<float> x = random_values(static_cast<size_t>(t.batch * t.in_c * in_plane), 22);
    const std::vector<float> w = layer.parameters()[0]->value.to_vector();
    const std::vector<float> b = t.bias ? layer.parameters()[1]->value.to_vector() : std::vector<float>(t.out_c, 0.f);
    const std::string what =
        fmt::format("batch {} in {} {}x{} kernel {} bias {} relu {}", t.batch, t.in_c, t.hw, t.hw, k, t.bias, t.relu);
    std::vector<float> want_y = direct_conv(x, w, b, t.batch, t.in_c, t.hw, t.hw, t.out_c, k, 1, pad);
    if (t.relu)
      for (float& v : want_y) v = std::max(v, 0.f);
    const Tensor y = layer.forward(Tensor::from_vector(x, {t.batch, t.in_c, t.hw, t.hw}));
    const std::vector<float> got_y = y.to_vector();
    for (size_t i = 0; i < got_y.size(); ++i) ASSERT_NEAR(got_y[i], want_y[i], 1e-4f) << what << " y[" << i << "]";
    // dY' = dY masked by the ReLU's output; dW, db, dX by the direct loops in double.
    const std::vector<float> dy = random_values(got_y.size(), 23);
    std::vector<double> dw(w.size()), db(static_cast<size_t>(t.out_c)), dx(x.size());
    for (int64_t n = 0; n < t.batch; ++n)
      for (int64_t oc = 0; oc < t.out_c; ++oc)
        for (int64_t p = 0; p < plane; ++p) {
          const size_t o = static_cast<size_t>((n * t.out_c + oc) * plane + p);
          const double g = t.relu && !(got_y[o] > 0.f) ? 0.0 : dy[o];
          db[static_cast<size_t>(oc)] += g;
          for (int64_t ci = 0; ci < t.in_c; ++ci)
            for (int64_t ky = 0; ky < k; ++ky)
              for (int64_t kx = 0; kx < k; ++kx) {
                const int64_t iy = p / t.hw - pad + ky, ix = p % t.hw - pad + kx;
                if (iy < 0 || iy >= t.hw || ix < 0 || ix >= t.hw) continue;
                const size_t wi = static_cast<size_t>(((oc * t.in_c + ci) * k + ky) * k + kx);
                const size_t xi = static_cast<size_t>((n * t.in_c + ci) * in_plane + iy * t.hw + ix);
                dw[wi] += g * x[xi];
                dx[xi] += g * w[wi];
              }
        }
    for (int pass = 1; pass <= 2; ++pass) {  // pass 2 accumulates onto pass 1's gradients
      for (Parameter* q : layer.parameters()) q->grad_is_zero = pass == 1;
      const Tensor got_dx = layer.backward(Tensor::from_vector(dy, y.shape()));
      const std::vector<float> gdx = got_dx.to_vector(), gdw = layer.parameters()[0]->grad.to_vector();
      for (size_t i = 0; i < gdx.size(); ++i) ASSERT_NEAR(gdx[i], dx[i], 1e-4) << what << " dx[" << i << "]";
      for (size_t i = 0; i < gdw.size(); ++i) ASSERT_NEAR(gdw[i], pass * dw[i], 1e-3) << what << " pass " << pass << " dw[" << i << "]";
      if (!t.bias) continue;
      const std::vector<float> gdb = layer.parameters()[1]->grad.to_vector();
      for (size_t i = 0; i < gdb.size(); ++i) ASSERT_NEAR(gdb[i], pass * db[i], 1e-3) << what << " pass " << pass << " db[" << i << "]";
    }
  }
}

// A layer that has seen a larger batch (larger scratch, e.g. the ones for the bias gradient)
// gives a smaller batch exactly the output and gradients a fresh layer gives it.
TEST(Conv2d, SmallerBatchAfterLargerMatchesFreshLayer) {
  auto make = [] {
    InitRng rng(13);
    return Conv2d(2, 3, 3, 2, 1, Device::cpu(), rng);
  };
  Conv2d used = make(), fresh = make();
  auto run = [](Conv2d& layer, int64_t batch, uint32_t seed) {
    Tensor x = Tensor::from_vector(random_values(static_cast<size_t>(batch * 2 * 5 * 5), seed), {batch, 2, 5, 5});
    Tensor y = layer.forward(x);
    for (Parameter* q : layer.parameters()) q->grad_is_zero = true;  // overwrite, as after zero_grad
    Tensor dx = layer.backward(Tensor::from_vector(random_values(static_cast<size_t>(y.numel()), seed + 1), y.shape()));
    std::vector<std::vector<float>> out{y.to_vector(), dx.to_vector()};
    for (Parameter* q : layer.parameters()) out.push_back(q->grad.to_vector());
    return out;
  };
  run(used, 5, 20);
  EXPECT_EQ(run(used, 2, 30), run(fresh, 2, 30));
}

// PyTorch refuses a window larger than the padded input; truncating division used to turn
// (4 - 5) / 2 + 1 into one output row that no full window backs.
TEST(Conv2d, WindowLargerThanPaddedInputIsRefused) {
  InitRng rng(1);
  Conv2d conv(1, 2, 5, 2, 0, Device::cpu(), rng);
  EXPECT_THROW(conv.forward(Tensor::zeros({1, 1, 4, 4})), Error);
  EXPECT_EQ(conv.forward(Tensor::zeros({1, 1, 5, 5})).shape(), (Shape{1, 2, 1, 1}));
  MaxPool2d pool(3, 2);
  EXPECT_THROW(pool.forward(Tensor::zeros({1, 1, 2, 9})), Error);
  EXPECT_EQ(pool.forward(Tensor::zeros({1, 1, 3, 9})).shape(), (Shape{1, 1, 1, 4}));
}

// Sizes whose products overflow are refused by the layer, naming it, before any allocation.
TEST(Conv2d, OverflowingSizesAreRefusedBeforeAllocating) {
  InitRng rng(1);
  EXPECT_THROW(Conv2d(int64_t{1} << 40, int64_t{1} << 30, 5, 1, 0, Device::cpu(), rng), Error);
  try {
    Linear(784, 4611686018427387904, Device::cpu(), rng);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "Linear(784, 4611686018427387904) weight: 4611686018427387904 x 784 overflows 64 bits");
  }
  EXPECT_THROW(Linear(0, 10, Device::cpu(), rng), Error);
}

}  // namespace
}  // namespace dtrain
