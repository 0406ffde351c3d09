// The GPT layers: LayerNorm, tanh-GELU, the token + position embedding and the tied LM head,
// each against central finite differences (gradcheck.h) and against their defining formulas,
// and the embedding's deterministic backward.
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/ops.h"
#include "gradcheck.h"
#include "model/activation.h"
#include "model/embedding.h"
#include "model/gpt_kernels.h"
#include "model/layernorm.h"

namespace dtrain {
namespace {

using testing::expect_gradients_match;
using testing::random_values;

Tensor random_tensor(const Shape& shape, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  return Tensor::from_vector(random_values(static_cast<size_t>(shape_numel(shape)), seed, lo, hi), shape);
}

Tensor tokens_tensor(const std::vector<int32_t>& ids, int64_t batch, int64_t seq) {
  Tensor t = Tensor::empty({batch, seq}, Device::cpu(), DType::kI32);
  std::memcpy(t.data_as<int32_t>(), ids.data(), ids.size() * sizeof(int32_t));
  return t;
}

// ---- LayerNorm ----

TEST(LayerNorm, StartsAsWeightOnesBiasZerosAndNormalisesEachRow) {
  LayerNorm ln(6, Device::cpu());
  auto p = ln.parameters();
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0]->name, "weight");
  EXPECT_EQ(p[1]->name, "bias");
  for (float v : p[0]->value.to_vector()) EXPECT_EQ(v, 1.f);
  for (float v : p[1]->value.to_vector()) EXPECT_EQ(v, 0.f);
  std::vector<float> y = ln.forward(random_tensor({2, 3, 6}, 1, -3.f, 5.f)).to_vector();
  for (int r = 0; r < 6; ++r) {
    double mean = 0, var = 0;
    for (int c = 0; c < 6; ++c) mean += y[r * 6 + c] / 6.0;
    for (int c = 0; c < 6; ++c) var += (y[r * 6 + c] - mean) * (y[r * 6 + c] - mean) / 6.0;
    EXPECT_NEAR(mean, 0.0, 1e-6);
    EXPECT_NEAR(var, 1.0, 1e-4);  // biased variance, + eps 1e-5 in the denominator as PyTorch
  }
}

// Non-trivial weight and bias so that their gradients and dx's use of w are exercised.
void randomise(LayerNorm& ln, uint32_t seed) {
  for (Parameter* p : ln.parameters())
    p->value.copy_from(random_tensor(p->value.shape(), seed++, 0.5f, 1.5f));
}

TEST(GradCheck, LayerNorm) {
  LayerNorm ln(7, Device::cpu());
  randomise(ln, 3);
  // LayerNorm is not linear: h small enough that the h^2 truncation stays below the tolerance.
  expect_gradients_match(ln, random_tensor({2, 3, 7}, 4, -2.f, 2.f), 3e-3f, 2e-3, 2e-3);
}

TEST(LayerNorm, BackwardAddIsBackwardPlusTheResidualBitForBit) {
  LayerNorm a(5, Device::cpu()), b(5, Device::cpu());
  randomise(a, 5);
  randomise(b, 5);
  Tensor x = random_tensor({4, 5}, 6), dy = random_tensor({4, 5}, 7), res = random_tensor({4, 5}, 8);
  a.forward(x);
  b.forward(x);
  std::vector<float> plain = a.backward(dy).to_vector(), fused = b.backward_add(dy, res).to_vector();
  std::vector<float> r = res.to_vector();
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(fused[i], r[i] + plain[i]) << i;
  // and the parameter gradients are the same
  EXPECT_EQ(a.parameters()[0]->grad.to_vector(), b.parameters()[0]->grad.to_vector());
}

// Over 600 rows (two full chunks of 256 and a partial one: Note [LayerNorm parameter gradient])
// the weight and bias gradients are the double-precision sums within float rounding.
TEST(LayerNorm, ParameterGradientsOverSeveralRowChunksAreTheSumsOverAllRows) {
  const int64_t rows = 600, cols = 5;
  LayerNorm ln(cols, Device::cpu());
  randomise(ln, 30);
  const Tensor x = random_tensor({rows, cols}, 31), dy = random_tensor({rows, cols}, 32);
  ln.forward(x);
  ln.parameters()[0]->grad_is_zero = ln.parameters()[1]->grad_is_zero = true;
  ln.backward(dy);
  const std::vector<float> xv = x.to_vector(), g = dy.to_vector();
  const std::vector<float> dw = ln.parameters()[0]->grad.to_vector(), db = ln.parameters()[1]->grad.to_vector();
  std::vector<double> want_w(cols, 0.0), want_b(cols, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < cols; ++c) mean += xv[r * cols + c] / double(cols);
    for (int64_t c = 0; c < cols; ++c) var += (xv[r * cols + c] - mean) * (xv[r * cols + c] - mean) / double(cols);
    for (int64_t c = 0; c < cols; ++c) {
      want_w[c] += g[r * cols + c] * (xv[r * cols + c] - mean) / std::sqrt(var + 1e-5);
      want_b[c] += g[r * cols + c];
    }
  }
  for (int64_t c = 0; c < cols; ++c) {
    EXPECT_NEAR(dw[c], want_w[c], 1e-4 * (1 + std::abs(want_w[c]))) << c;
    EXPECT_NEAR(db[c], want_b[c], 1e-4 * (1 + std::abs(want_b[c]))) << c;
  }
}

// ---- GELU ----

TEST(GELU, TanhApproximationMatchesPyTorch) {
  GELU g;
  // torch.nn.functional.gelu(x, approximate="tanh") for these x (torch 2.x, float32)
  std::vector<float> y = g.forward(Tensor::from_vector(std::vector<float>{1.f, -0.5f, 2.5f, -3.f, 0.f}, {5})).to_vector();
  const float expected[] = {0.841192007f, -0.154285997f, 2.48491573f, -0.00363743305f, 0.f};
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(y[i], expected[i], 2e-7f * (1.f + std::abs(expected[i]))) << i;
}

// Note [Arithmetic tanh]: within 3e-7 of tanh (absolute) over the whole line, NaN kept by GELU.
TEST(GELU, ArithmeticTanhIsWithinAFewUlpsOfOne) {
  double worst = 0;
  for (int i = -200000; i <= 200000; ++i) {
    const float u = static_cast<float>(i) * 1e-4f;  // [-20, 20]
    worst = std::max(worst, std::abs(static_cast<double>(kernels::arith_tanh(u)) - std::tanh(static_cast<double>(u))));
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(kernels::arith_tanh(1e30f), 1.f);
  EXPECT_EQ(kernels::arith_tanh(-INFINITY), -1.f);
  EXPECT_EQ(kernels::arith_tanh(0.f), 0.f);
  GELU g;
  EXPECT_TRUE(std::isnan(g.forward(Tensor::from_vector(std::vector<float>{NAN}, {1})).to_vector()[0]));
}

TEST(GradCheck, GELU) {
  GELU g;
  expect_gradients_match(g, random_tensor({3, 8}, 9, -3.f, 3.f), 3e-3f, 1e-3, 1e-3);
}

// The in-place backward the GPT's MLP uses gives backward()'s floats, in the buffer it was given.
TEST(GELU, BackwardInPlaceEqualsBackwardInTheGivenBuffer) {
  GELU g;
  g.forward(random_tensor({5, 12}, 12, -4.f, 4.f));
  const Tensor dy = random_tensor({5, 12}, 13);
  const std::vector<float> want = g.backward(dy).to_vector();
  Tensor buffer = Tensor::from_vector(dy.to_vector(), {5, 12});
  const Tensor got = g.backward_in_place(buffer);
  EXPECT_TRUE(got.shares_storage(buffer));
  EXPECT_EQ(got.to_vector(), want);
}

// ---- Token + position embedding ----

TEST(TokenEmbedding, OutputIsTheTokenRowPlusThePositionRow) {
  TokenEmbedding e(5, 4, 3, Device::cpu());
  e.wte().value.copy_from(random_tensor({5, 3}, 10));
  e.wpe().value.copy_from(random_tensor({4, 3}, 11));
  const std::vector<float> wte = e.wte().value.to_vector(), wpe = e.wpe().value.to_vector();
  const std::vector<int32_t> ids = {4, 0, 4, 2, 2, 1};
  std::vector<float> y = e.forward(tokens_tensor(ids, 2, 3)).to_vector();  // T = 3 < context 4
  for (int p = 0; p < 6; ++p)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(y[p * 3 + c], wte[ids[p] * 3 + c] + wpe[(p % 3) * 3 + c]);
}

// Repeated tokens (two contributions to one row), a token absent (zero row), T < context (wpe
// rows past T get zero): the backward against finite differences.
TEST(GradCheck, TokenEmbedding) {
  TokenEmbedding e(6, 5, 4, Device::cpu());
  e.wte().value.copy_from(random_tensor({6, 4}, 12));
  e.wpe().value.copy_from(random_tensor({5, 4}, 13));
  expect_gradients_match(e, tokens_tensor({3, 1, 3, 5, 3, 0, 1, 1}, 2, 4), 1e-2f, 1e-3, 1e-3, false);
}

// TokenEmbedding(vocab, seq, channels)'s wte gradient for token ids drawn as floor(u * spread) +
// low, u uniform in [0, 1), and a random dy, on 1 and on 3 threads, against the sums of dy over the
// positions holding each token in position order, as a plain host loop adds them (tokens outside
// [0, V) add to no row): bit for bit.
void expect_position_order_sum(int64_t vocab, int64_t channels, int64_t batch, int64_t seq, float spread, int32_t low,
                               uint32_t seed) {
  std::vector<int32_t> ids(static_cast<size_t>(batch * seq));
  std::vector<float> pick = random_values(ids.size(), seed, 0.f, 1.f);
  for (size_t p = 0; p < ids.size(); ++p) ids[p] = static_cast<int32_t>(pick[p] * spread) + low;
  const Tensor tokens = tokens_tensor(ids, batch, seq);
  const Tensor dy = random_tensor({batch, seq, channels}, seed + 1, -10.f, 10.f);
  std::vector<float> expected(static_cast<size_t>(vocab * channels), 0.f);
  const std::vector<float> g = dy.to_vector();
  for (size_t p = 0; p < ids.size(); ++p)
    if (ids[p] >= 0 && ids[p] < vocab)
      for (int64_t c = 0; c < channels; ++c) expected[ids[p] * channels + c] += g[p * channels + c];
  for (int threads : {1, 3}) {
    ASSERT_EQ(set_cpu_threads(threads), threads);
    TokenEmbedding e(vocab, seq, channels, Device::cpu());
    e.wte().grad_is_zero = e.wpe().grad_is_zero = true;
    e.forward(tokens);
    e.backward(dy);
    const std::vector<float> got = e.wte().grad.to_vector();
    ASSERT_EQ(got.size(), expected.size());
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &expected[i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << "threads " << threads;
  }
  set_cpu_threads(1);
}

// The backward's wte rows are the sums of dy over the positions holding the token, in
// position order: the floats a plain host loop gives, bit for bit, on 1 and on 3 threads (a
// launch of 2^18 elements is split across the threads: core/launch.h).
TEST(TokenEmbedding, BackwardIsThePositionOrderSumOnAnyThreadCount) {
  // vocab * channels = 2^18; 24 tokens of 1024: few tokens, many repeats
  expect_position_order_sum(1024, 256, 4, 64, 24.f, 0, 14);
}

// The parallel bucket build (Note [Token buckets]) at a position count that is no power of two
// (the merge rounds end on a partial run) and with tokens outside [0, V), which belong to no
// row: still the host loop's floats, bit for bit, on 1 and on 3 threads.
TEST(TokenEmbedding, BucketsOfAnOddPositionCountAndOutOfRangeTokensGiveThePositionOrderSum) {
  expect_position_order_sum(50, 8, 3, 37, 60.f, -3, 21);  // 111 positions, tokens -3 .. 56
}

TEST(TokenEmbedding, RefusesTokensLongerThanTheContextOrNotInt32) {
  TokenEmbedding e(5, 4, 3, Device::cpu());
  EXPECT_THROW(e.forward(tokens_tensor({0, 1, 2, 3, 4}, 1, 5)), Error);
  EXPECT_THROW(e.forward(random_tensor({1, 3}, 1)), Error);
}

// ---- The tied LM head ----

// A module around the head with a wte of its own, so gradcheck sees wte as its parameter. The
// head itself never fires the hook: Note [Tied embedding gradient].
class HeadOnly : public Module {
 public:
  explicit HeadOnly(Tensor w) : wte_{"wte", w, Tensor::zeros(w.shape())}, head_(wte_) {}
  Tensor forward(const Tensor& x) override { return head_.forward(x); }
  Tensor backward(const Tensor& dy, bool) override { return head_.backward(dy); }
  std::vector<Parameter*> parameters() override { return {&wte_}; }
  std::string describe() const override { return "HeadOnly"; }
  Parameter wte_;
  TiedLmHead head_;
};

TEST(GradCheck, TiedLmHead) {
  HeadOnly m(random_tensor({9, 4}, 16));
  expect_gradients_match(m, random_tensor({5, 4}, 17));
}

// (The head has no hook to fire: it is not a Module; the GPT's hook order test checks wte's one hook.)
TEST(TiedLmHead, OverwritesStaleWteGradientAfterZeroGradThenAccumulates) {
  HeadOnly m(random_tensor({9, 4}, 18));
  Tensor x = random_tensor({5, 4}, 19);
  Tensor dy = random_tensor({5, 9}, 20);
  m.wte_.grad.copy_from(Tensor::from_vector(std::vector<float>(36, NAN), {9, 4}));
  m.wte_.grad_is_zero = true;  // stale NaN memory: the first write must overwrite
  m.forward(x);
  m.backward(dy, true);
  const std::vector<float> once = m.wte_.grad.to_vector();
  for (float v : once) EXPECT_TRUE(std::isfinite(v));
  m.backward(dy, true);  // second backward accumulates
  const std::vector<float> twice = m.wte_.grad.to_vector();
  for (size_t i = 0; i < once.size(); ++i) EXPECT_FLOAT_EQ(twice[i], 2 * once[i]);
}

}  // namespace
}  // namespace dtrain
