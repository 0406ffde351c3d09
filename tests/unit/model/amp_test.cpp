// bf16 mixed precision: gemm_bf16 is the float32 GEMM of bf16-rounded operands (every
// transpose), a Linear under AmpMode::kBf16 stays within bf16 rounding of float32 and is
// exactly "round the operands, accumulate in float32", and an MLP trains under it like float32.
#include <algorithm>
#include <cmath>
#include <random>
#include <span>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "core/kernels.h"
#include "core/ops.h"
#include "model/linear.h"
#include "model/loss.h"
#include "model/models.h"
#include "model/optimizer.h"
#include "gradcheck.h"

namespace dtrain {
namespace {

using testing::random_values;

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = kernels::float_to_bf16(v[i]);
  return out;
}

std::vector<float> rounded(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = kernels::bf16_to_float(kernels::float_to_bf16(v[i]));
  return out;
}

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

class GemmBf16 : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(GemmBf16, IsTheFloatGemmOfRoundedOperands) {
  const auto [ta, tb] = GetParam();
  const int64_t sizes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 65}, {64, 10, 256}, {5, 129, 300}};
  unsigned seed = 11;
  for (const auto& s : sizes) {
    const int64_t m = s[0], n = s[1], k = s[2];
    const std::vector<float> a = random_values(static_cast<size_t>(m * k), seed++);
    const std::vector<float> b = random_values(static_cast<size_t>(k * n), seed++);
    const std::vector<float> c0 = random_values(static_cast<size_t>(m * n), seed++);
    const std::vector<float> ra = rounded(a), rb = rounded(b);

    std::vector<float> got = c0, want = c0;
    gemm_bf16(Device::cpu(), ta, tb, m, n, k, 0.7f, to_bf16(a).data(), to_bf16(b).data(), 0.3f, got.data());
    gemm(Device::cpu(), ta, tb, m, n, k, 0.7f, ra.data(), rb.data(), 0.3f, want.data());
    EXPECT_EQ(got, want) << "m=" << m << " n=" << n << " k=" << k << " ta=" << ta << " tb=" << tb;

    // Independently of BLAS: the row-major contract (A stored [k,m] when transposed, B [n,k]),
    // in double over the rounded operands. Float32 accumulation differs by ~k ulps at most.
    double worst = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double av = ra[static_cast<size_t>(ta ? p * m + i : i * k + p)];
          const double bv = rb[static_cast<size_t>(tb ? j * k + p : p * n + j)];
          sum += av * bv;
        }
        const double ref = 0.7 * sum + 0.3 * c0[static_cast<size_t>(i * n + j)];
        worst = std::max(worst, std::fabs(ref - got[static_cast<size_t>(i * n + j)]));
      }
    EXPECT_LE(worst, 4.0 * static_cast<double>(k) * 1.2e-7 + 1e-6) << "m=" << m << " n=" << n << " k=" << k;
  }
}

TEST_P(GemmBf16, BetaZeroIgnoresWhatCHeld) {
  const auto [ta, tb] = GetParam();
  const std::vector<uint16_t> a = to_bf16(random_values(6 * 4, 1)), b = to_bf16(random_values(4 * 5, 2));
  std::vector<float> clean(30, 0.f), dirty(30, std::nanf(""));
  gemm_bf16(Device::cpu(), ta, tb, 6, 5, 4, 1.f, a.data(), b.data(), 0.f, clean.data());
  gemm_bf16(Device::cpu(), ta, tb, 6, 5, 4, 1.f, a.data(), b.data(), 0.f, dirty.data());
  EXPECT_EQ(clean, dirty);
}

// Operands and result inside wider rows (the LM head's padded logits): the same bits as the
// compact product, and the columns past each width untouched.
TEST_P(GemmBf16, StridedBlocksGiveTheCompactProduct) {
  const auto [ta, tb] = GetParam();
  const int64_t m = 7, n = 5, k = 6, pad = 3;
  const std::vector<uint16_t> a = to_bf16(random_values(m * k, 11)), b = to_bf16(random_values(k * n, 12));
  const int64_t a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
  const auto widen = [pad](const std::vector<uint16_t>& v, int64_t rows, int64_t cols) {
    std::vector<uint16_t> out(static_cast<size_t>(rows * (cols + pad)), kernels::float_to_bf16(std::nanf("")));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) out[static_cast<size_t>(r * (cols + pad) + c)] = v[static_cast<size_t>(r * cols + c)];
    return out;
  };
  const std::vector<uint16_t> wide_a = widen(a, a_rows, a_cols), wide_b = widen(b, b_rows, b_cols);
  std::vector<float> compact(static_cast<size_t>(m * n), 0.5f), wide(static_cast<size_t>(m * (n + pad)), 0.5f);
  gemm_bf16(Device::cpu(), ta, tb, m, n, k, 0.7f, a.data(), b.data(), 0.3f, compact.data());
  gemm_half_strided(Device::cpu(), DType::kBF16, ta, tb, m, n, k, 0.7f, wide_a.data(), a_cols + pad, wide_b.data(),
                    b_cols + pad, 0.3f, wide.data(), n + pad);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < n; ++c)
      EXPECT_EQ(wide[static_cast<size_t>(r * (n + pad) + c)], compact[static_cast<size_t>(r * n + c)]) << r << "," << c;
    for (int64_t c = n; c < n + pad; ++c) EXPECT_EQ(wide[static_cast<size_t>(r * (n + pad) + c)], 0.5f) << "pad " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, GemmBf16, ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "At" : "A") +
                                  (std::get<1>(info.param) ? "Bt" : "B");
                         });

// Two identical Linear layers (same seed), one under bf16 autocast.
struct LinearPair {
  static constexpr int64_t kIn = 96, kOut = 40, kBatch = 24;
  InitRng rng_fp32{5}, rng_amp{5};
  Linear fp32{kIn, kOut, Device::cpu(), rng_fp32};
  Linear amp{kIn, kOut, Device::cpu(), rng_amp};
  LinearPair() { amp.set_amp(AmpMode::kBf16); }
};

TEST(LinearAmp, OutputAndGradientsStayWithinBf16RoundingOfFloat32) {
  LinearPair l;
  const std::vector<float> x = random_values(LinearPair::kBatch * LinearPair::kIn, 21, -2.f, 2.f);
  const std::vector<float> dy = random_values(LinearPair::kBatch * LinearPair::kOut, 22);
  const Tensor input = Tensor::from_vector(x, {LinearPair::kBatch, LinearPair::kIn});
  const Tensor grad_out = Tensor::from_vector(dy, {LinearPair::kBatch, LinearPair::kOut});

  const std::vector<float> y32 = l.fp32.forward(input).to_vector(), y16 = l.amp.forward(input).to_vector();
  const std::vector<float> dx32 = l.fp32.backward(grad_out).to_vector(), dx16 = l.amp.backward(grad_out).to_vector();
  // bf16 keeps 8 significant bits (relative rounding <= 2^-9 per operand); sums of products
  // of rounded operands stay within ~1% of the largest magnitude.
  EXPECT_LE(max_abs_diff(y16, y32), 1e-2f * max_abs(y32));
  EXPECT_LE(max_abs_diff(dx16, dx32), 1e-2f * max_abs(dx32));
  const auto p32 = l.fp32.parameters(), p16 = l.amp.parameters();
  const std::vector<float> dw32 = p32[0]->grad.to_vector(), dw16 = p16[0]->grad.to_vector();
  EXPECT_LE(max_abs_diff(dw16, dw32), 1e-2f * max_abs(dw32));
  EXPECT_EQ(p16[1]->grad.to_vector(), p32[1]->grad.to_vector()) << "the bias gradient stays float32";
  // ...and bf16 is really in effect (the inputs are not bf16-exact).
  EXPECT_GT(max_abs_diff(y16, y32), 0.f);
  EXPECT_GT(max_abs_diff(dw16, dw32), 0.f);
  // Master weights stay float32, untouched by the forward's packing.
  EXPECT_EQ(p16[0]->value.to_vector(), p32[0]->value.to_vector());
}

TEST(LinearAmp, IsExactlyRoundedOperandsWithFloatAccumulation) {
  LinearPair l;
  const std::vector<float> x = random_values(LinearPair::kBatch * LinearPair::kIn, 31, -3.f, 3.f);
  const std::vector<float> w = l.amp.parameters()[0]->value.to_vector();
  const std::vector<float> bias = l.amp.parameters()[1]->value.to_vector();
  const std::vector<float> y = l.amp.forward(Tensor::from_vector(x, {LinearPair::kBatch, LinearPair::kIn})).to_vector();
  const std::vector<float> rx = rounded(x), rw = rounded(w);
  double worst = 0;
  for (int64_t i = 0; i < LinearPair::kBatch; ++i)
    for (int64_t o = 0; o < LinearPair::kOut; ++o) {
      double sum = bias[static_cast<size_t>(o)];
      for (int64_t j = 0; j < LinearPair::kIn; ++j)
        sum += static_cast<double>(rx[static_cast<size_t>(i * LinearPair::kIn + j)]) *
               rw[static_cast<size_t>(o * LinearPair::kIn + j)];
      worst = std::max(worst, std::fabs(sum - y[static_cast<size_t>(i * LinearPair::kOut + o)]));
    }
  EXPECT_LE(worst, 1e-4);  // float32 accumulation of 96 terms of magnitude <= ~0.3
}

// The MLP's forward written out by hand with every Linear's input and weight rounded to bf16
// and the product summed in float32 (bias as the GEMM's initial C, as Linear does it).
std::vector<float> bf16_reference_forward(Module& mlp, const Tensor& x) {
  const auto params = mlp.parameters();  // weight, bias per Linear
  const int64_t batch = x.dim(0);
  std::vector<float> act = x.to_vector();
  for (size_t l = 0; l < params.size(); l += 2) {
    const Tensor& w = params[l]->value;
    const int64_t out = w.dim(0), in = w.dim(1);
    std::vector<float> xr = act, wr = w.to_vector(), bias = params[l + 1]->value.to_vector();
    for (float& v : xr) v = kernels::bf16_to_float(kernels::float_to_bf16(v));
    for (float& v : wr) v = kernels::bf16_to_float(kernels::float_to_bf16(v));
    std::vector<float> y(static_cast<size_t>(batch * out));
    for (int64_t r = 0; r < batch; ++r) std::copy(bias.begin(), bias.end(), y.begin() + r * out);
    gemm(Device::cpu(), false, true, batch, out, in, 1.f, xr.data(), wr.data(), 1.f, y.data());
    if (l + 2 < params.size())
      for (float& v : y) v = v > 0.f ? v : 0.f;  // ReLU between Linears
    act = std::move(y);
  }
  return act;
}

TEST(LinearAmp, SequentialPassesTheModeToItsLinearLayers) {
  // Under bf16 every Linear of the MLP (not just the first) rounds its operands: the logits
  // equal, bit for bit, a reference that rounds every layer's input and weight; and they
  // differ from the plain float32 model's.
  const Shape sample{1, 6, 6};
  auto plain = build_model(ModelSpec{ModelKind::kMlp, {16, 12}}, sample, 4, Device::cpu(), 9);
  auto amp = build_model(ModelSpec{ModelKind::kMlp, {16, 12}}, sample, 4, Device::cpu(), 9);
  amp->set_amp(AmpMode::kBf16);
  const Tensor x = Tensor::from_vector(random_values(8 * 36, 41), {8, 1, 6, 6});
  const std::vector<float> y32 = plain->forward(x).to_vector(), y16 = amp->forward(x).to_vector();
  EXPECT_EQ(y16, bf16_reference_forward(*amp, x.view({8, 36})));
  EXPECT_GT(max_abs_diff(y16, y32), 0.f);
  EXPECT_LE(max_abs_diff(y16, y32), 2e-2f * max_abs(y32));
  amp->set_amp(AmpMode::kOff);
  EXPECT_EQ(amp->forward(x).to_vector(), y32) << "off restores float32 exactly";
}

// Mean cross-entropy after each of `steps` SGD steps on a fixed synthetic task: labels from a
// random linear teacher over Gaussian inputs, an MLP student.
std::vector<float> train_losses(AmpMode mode, int steps) {
  constexpr int64_t kDim = 20, kClasses = 4, kBatch = 64, kSamples = 512;
  std::mt19937 rng(123);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> teacher(kDim * kClasses), inputs(kSamples * kDim);
  for (float& v : teacher) v = normal(rng);
  for (float& v : inputs) v = normal(rng);
  std::vector<int32_t> labels(kSamples);
  for (int64_t s = 0; s < kSamples; ++s) {
    float best = -1e30f;
    for (int64_t c = 0; c < kClasses; ++c) {
      float score = 0;
      for (int64_t d = 0; d < kDim; ++d) score += inputs[static_cast<size_t>(s * kDim + d)] * teacher[static_cast<size_t>(d * kClasses + c)];
      if (score > best) best = score, labels[static_cast<size_t>(s)] = static_cast<int32_t>(c);
    }
  }
  auto model = build_model(ModelSpec{ModelKind::kMlp, {32}}, {kDim}, kClasses, Device::cpu(), 7);
  model->set_amp(mode);
  Sgd opt(model->parameters(), SgdOptions{0.05f, 0.9f});
  CrossEntropyLoss loss_fn;
  std::vector<float> losses;
  for (int step = 0; step < steps; ++step) {
    const int64_t first = (step * kBatch) % kSamples;
    Tensor x = Tensor::from_vector(std::span<const float>(inputs).subspan(static_cast<size_t>(first * kDim),
                                                                          static_cast<size_t>(kBatch * kDim)),
                                   {kBatch, kDim});
    Tensor y = Tensor::empty({kBatch}, Device::cpu(), DType::kI32);
    std::copy_n(labels.begin() + first, kBatch, y.data_as<int32_t>());
    opt.zero_grad();
    losses.push_back(loss_value(loss_fn.forward(model->forward(x), y)));
    model->backward(loss_fn.backward(), false);
    opt.step();
  }
  return losses;
}

TEST(LinearAmp, MlpTrainsUnderBf16LikeFloat32) {
  constexpr int kSteps = 48;
  const std::vector<float> fp32 = train_losses(AmpMode::kOff, kSteps);
  const std::vector<float> bf16 = train_losses(AmpMode::kBf16, kSteps);
  auto tail_mean = [](const std::vector<float>& v) {  // last 8 steps = one pass over the data
    double s = 0;
    for (size_t i = v.size() - 8; i < v.size(); ++i) s += v[i];
    return s / 8;
  };
  EXPECT_NEAR(bf16.front(), fp32.front(), 2e-2 * fp32.front()) << "same start, up to rounding";
  EXPECT_LT(tail_mean(fp32), 0.5 * fp32.front());
  EXPECT_LT(tail_mean(bf16), 0.5 * bf16.front()) << "bf16 learns";
  EXPECT_NEAR(tail_mean(bf16), tail_mean(fp32), 0.1 * fp32.front()) << "and about as well as float32";
}

}  // namespace
}  // namespace dtrain
