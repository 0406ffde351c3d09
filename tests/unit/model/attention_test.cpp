// CausalSelfAttention (model/attention.h): forward against a naive double-precision loop, backward
// against finite differences, causality, names, init, hooks, bf16, and no allocation after the
// first step. T = 130 spans three causal blocks of 64 (the last one partial), T = 5 one.
#include <cmath>
#include <cstdio>
#include <ctime>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/host_allocator.h"
#include "core/ops.h"
#include "gradcheck.h"
#include "model/attention.h"

namespace dtrain {
namespace {

using testing::expect_gradients_match;
using testing::random_values;

// Weights U(-a, a) instead of GPT-2's small normals, so the scores are O(1) and the softmax is
// far from uniform: a test through near-constant probabilities would miss most of its gradient.
void randomise(CausalSelfAttention& layer, float a, uint32_t seed) {
  for (Parameter* p : layer.parameters()) {
    std::vector<float> v = random_values(static_cast<size_t>(p->value.numel()), seed++, -a, a);
    p->value.copy_from(Tensor::from_vector(v, p->value.shape()));
  }
}

// y = c_proj(attention(c_attn(x))) by the definition, in double: x is (B, T, C).
std::vector<double> naive_attention(CausalSelfAttention& layer, const std::vector<float>& x, int64_t B, int64_t T,
                                    int64_t C, int64_t H) {
  auto params = layer.parameters();
  const std::vector<float> wa = params[0]->value.to_vector(), ba = params[1]->value.to_vector();
  const std::vector<float> wp = params[2]->value.to_vector(), bp = params[3]->value.to_vector();
  const int64_t hs = C / H;
  std::vector<double> qkv(static_cast<size_t>(B * T * 3 * C)), y(static_cast<size_t>(B * T * C), 0.0);
  for (int64_t r = 0; r < B * T; ++r)
    for (int64_t o = 0; o < 3 * C; ++o) {
      double s = ba[o];
      for (int64_t i = 0; i < C; ++i) s += static_cast<double>(x[r * C + i]) * wa[o * C + i];
      qkv[r * 3 * C + o] = s;
    }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        auto at = [&](int64_t u, int part, int64_t d) { return qkv[((b * T + u) * 3 + part) * C + h * hs + d]; };
        std::vector<double> p(static_cast<size_t>(t + 1));
        double m = -INFINITY, sum = 0;
        for (int64_t u = 0; u <= t; ++u) {
          double s = 0;
          for (int64_t d = 0; d < hs; ++d) s += at(t, 0, d) * at(u, 1, d);
          p[u] = s / std::sqrt(static_cast<double>(hs));
          m = std::max(m, p[u]);
        }
        for (double& v : p) sum += (v = std::exp(v - m));
        for (int64_t d = 0; d < hs; ++d) {
          double s = 0;
          for (int64_t u = 0; u <= t; ++u) s += p[u] / sum * at(u, 2, d);
          y[(b * T + t) * C + h * hs + d] = s;
        }
      }
  std::vector<double> out(static_cast<size_t>(B * T * C));
  for (int64_t r = 0; r < B * T; ++r)
    for (int64_t o = 0; o < C; ++o) {
      double s = bp[o];
      for (int64_t i = 0; i < C; ++i) s += y[r * C + i] * wp[o * C + i];
      out[r * C + o] = s;
    }
  return out;
}

void expect_matches_naive(int64_t B, int64_t T, int64_t C, int64_t H) {
  InitRng rng(5);
  CausalSelfAttention layer(C, H, T + 3, Device::cpu(), rng, 0.1f);
  randomise(layer, 0.5f, 11);
  const std::vector<float> x = random_values(static_cast<size_t>(B * T * C), 3);
  const std::vector<float> got = layer.forward(Tensor::from_vector(x, {B, T, C})).to_vector();
  const std::vector<double> want = naive_attention(layer, x, B, T, C, H);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 + 1e-5 * std::abs(want[i])) << i;
}

TEST(CausalSelfAttention, ForwardMatchesNaiveLoopInOneCausalBlock) { expect_matches_naive(2, 5, 8, 2); }

TEST(CausalSelfAttention, ForwardMatchesNaiveLoopAcrossCausalBlocks) {
  static_assert(CausalSelfAttention::kCausalBlock < 65, "T = 130 must span three blocks");
  expect_matches_naive(2, 130, 8, 2);
}

TEST(CausalSelfAttention, GradientsMatchFiniteDifferences) {
  InitRng rng(1);
  CausalSelfAttention layer(8, 2, 5, Device::cpu(), rng, 0.1f);
  randomise(layer, 0.5f, 21);
  expect_gradients_match(layer, Tensor::from_vector(random_values(2 * 5 * 8, 4), {2, 5, 8}));
}

TEST(CausalSelfAttention, GradientsMatchFiniteDifferencesAcrossCausalBlocks) {
  InitRng rng(2);
  CausalSelfAttention layer(4, 2, 130, Device::cpu(), rng, 0.1f);
  randomise(layer, 0.7f, 31);
  expect_gradients_match(layer, Tensor::from_vector(random_values(1 * 130 * 4, 6), {1, 130, 4}));
}

// Changing token t's input changes no output before t (bitwise), and does change output t.
TEST(CausalSelfAttention, OutputsBeforeATokenDoNotDependOnIt) {
  const int64_t B = 2, T = 130, C = 8;
  InitRng rng(3);
  CausalSelfAttention layer(C, 2, T, Device::cpu(), rng, 0.1f);
  randomise(layer, 0.5f, 41);
  std::vector<float> x = random_values(static_cast<size_t>(B * T * C), 8);
  const std::vector<float> before = layer.forward(Tensor::from_vector(x, {B, T, C})).to_vector();
  for (int64_t t : {0, 1, 63, 64, 100, 129}) {
    std::vector<float> changed = x;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < C; ++c) changed[(b * T + t) * C + c] += 0.75f;
    const std::vector<float> after = layer.forward(Tensor::from_vector(changed, {B, T, C})).to_vector();
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = b * T * C; i < (b * T + t) * C; ++i) ASSERT_EQ(before[i], after[i]) << "t " << t << " i " << i;
      bool differs = false;
      for (int64_t i = (b * T + t) * C; i < (b * T + t + 1) * C; ++i) differs |= before[i] != after[i];
      EXPECT_TRUE(differs) << "token " << t << " changed nothing at itself";
    }
  }
}

TEST(CausalSelfAttention, NanoGptNamesShapesAndGpt2Init) {
  const int64_t C = 64;
  InitRng rng(7);
  const float proj_std = 0.02f / std::sqrt(8.f);
  CausalSelfAttention layer(C, 4, 16, Device::cpu(), rng, proj_std);
  auto params = layer.parameters();
  ASSERT_EQ(params.size(), 4u);
  const std::vector<std::pair<std::string, Shape>> want = {
      {"c_attn.weight", {3 * C, C}}, {"c_attn.bias", {3 * C}}, {"c_proj.weight", {C, C}}, {"c_proj.bias", {C}}};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(params[i]->name, want[i].first);
    EXPECT_EQ(params[i]->value.shape(), want[i].second) << want[i].first;
  }
  auto stats = [](const Tensor& t) {
    double s = 0, s2 = 0;
    for (float v : t.to_vector()) s += v, s2 += static_cast<double>(v) * v;
    const double n = static_cast<double>(t.numel());
    return std::pair{s / n, std::sqrt(s2 / n - (s / n) * (s / n))};
  };
  const auto [mean_a, std_a] = stats(params[0]->value);  // 12288 draws: the std within ~2%
  EXPECT_NEAR(mean_a, 0.0, 0.001);
  EXPECT_NEAR(std_a, 0.02, 0.02 * 0.04);
  const auto [mean_p, std_p] = stats(params[2]->value);
  EXPECT_NEAR(mean_p, 0.0, 0.001);
  EXPECT_NEAR(std_p, proj_std, proj_std * 0.06);
  for (int i : {1, 3})
    for (float v : params[i]->value.to_vector()) ASSERT_EQ(v, 0.f) << params[i]->name;
  // Same seed, same weights.
  InitRng again(7);
  CausalSelfAttention twin(C, 4, 16, Device::cpu(), again, proj_std);
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_EQ(params[i]->value.to_vector(), twin.parameters()[i]->value.to_vector());
}

TEST(CausalSelfAttention, HooksFireOnceEachInBackwardOrderWithFinalGradients) {
  InitRng rng(9);
  CausalSelfAttention layer(8, 2, 5, Device::cpu(), rng, 0.1f);
  std::vector<std::string> order;
  std::vector<std::vector<float>> at_hook;
  layer.set_grad_ready_hook([&](Parameter& p) {
    order.push_back(p.name);
    at_hook.push_back(p.grad.to_vector());
  });
  Tensor y = layer.forward(Tensor::from_vector(random_values(2 * 5 * 8, 1), {2, 5, 8}));
  layer.backward(Tensor::from_vector(random_values(static_cast<size_t>(y.numel()), 2), y.shape()), false);
  EXPECT_EQ(order, (std::vector<std::string>{"c_proj.bias", "c_proj.weight", "c_attn.bias", "c_attn.weight"}));
  auto params = layer.parameters();
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(at_hook[i], params[3 - i]->grad.to_vector()) << order[i];
}

TEST(CausalSelfAttention, BadSizesAndInputsAreOneError) {
  InitRng rng(1);
  EXPECT_THROW(CausalSelfAttention(10, 3, 8, Device::cpu(), rng, 0.02f), Error);  // 10 % 3
  EXPECT_THROW(CausalSelfAttention(8, 0, 8, Device::cpu(), rng, 0.02f), Error);
  EXPECT_THROW(CausalSelfAttention(0, 2, 8, Device::cpu(), rng, 0.02f), Error);
  CausalSelfAttention layer(8, 2, 4, Device::cpu(), rng, 0.02f);
  EXPECT_THROW(layer.forward(Tensor::zeros({1, 5, 8})), Error);  // T > context
  EXPECT_THROW(layer.forward(Tensor::zeros({1, 4, 6})), Error);  // C
  EXPECT_THROW(layer.forward(Tensor::zeros({4, 8})), Error);     // not (B, T, C)
}

TEST(CausalSelfAttention, Bf16AutocastStaysCloseToFloat32) {
  const int64_t B = 2, T = 20, C = 16;
  InitRng rng(4);
  CausalSelfAttention layer(C, 4, T, Device::cpu(), rng, 0.1f);
  randomise(layer, 0.5f, 51);
  const Tensor x = Tensor::from_vector(random_values(static_cast<size_t>(B * T * C), 9), {B, T, C});
  const std::vector<float> f32 = layer.forward(x).to_vector();
  layer.set_amp(AmpMode::kBf16);
  const std::vector<float> bf16 = layer.forward(x).to_vector();
  double largest = 0, diff = 0;
  bool any_differs = false;
  for (size_t i = 0; i < f32.size(); ++i) {
    largest = std::max(largest, static_cast<double>(std::abs(f32[i])));
    diff = std::max(diff, static_cast<double>(std::abs(f32[i] - bf16[i])));
    any_differs |= f32[i] != bf16[i];
  }
  EXPECT_TRUE(any_differs) << "set_amp(kBf16) did not reach the Linear layers";
  EXPECT_LT(diff, 0.02 * largest);
}

// The GPU runs every head in one pass of each product and softmax (a few large launches), the CPU
// one head per pass (model/attention.cpp): forced onto the CPU, the all-heads path gives the same
// output and gradients, and so does a group that does not divide the heads (3 of 2*4). The CPU's
// own path (Note [Attention in the rows layout]: no copies into heads) gives the very bits of the
// heads layout run one head per pass: the same products on the same numbers.
TEST(CausalSelfAttention, AllHeadsBatchedPathMatchesOneHeadPerPass) {
  const int64_t B = 2, T = 70, C = 16, H = 4;  // T spans two causal blocks
  const Tensor x = Tensor::from_vector(random_values(static_cast<size_t>(B * T * C), 21), {B, T, C});
  const Tensor dy = Tensor::from_vector(random_values(static_cast<size_t>(B * T * C), 22), {B, T, C});
  struct Run {
    std::vector<float> out, dx;
    std::vector<std::vector<float>> grads;
  };
  auto run = [&](int64_t heads_per_pass) {
    InitRng rng(8);
    CausalSelfAttention layer(C, H, T, Device::cpu(), rng, 0.1f);
    randomise(layer, 0.5f, 31);
    layer.set_heads_per_pass(heads_per_pass);
    Run r;
    r.out = layer.forward(x).to_vector();
    r.dx = layer.backward(dy, true).to_vector();
    for (Parameter* p : layer.parameters()) r.grads.push_back(p->grad.to_vector());
    return r;
  };
  const Run one = run(1);
  const Run rows = run(0);  // the CPU's default: the rows layout
  EXPECT_EQ(rows.out, one.out);
  EXPECT_EQ(rows.dx, one.dx);
  EXPECT_EQ(rows.grads, one.grads);
  for (int64_t group : {B * H, int64_t{3}}) {
    const Run batched = run(group);
    auto expect_close = [&](const std::vector<float>& got, const std::vector<float>& want, const char* what) {
      ASSERT_EQ(got.size(), want.size()) << what;
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 1e-5f + 1e-5f * std::abs(want[i])) << what << " " << i << ", group " << group;
    };
    expect_close(batched.out, one.out, "output");
    expect_close(batched.dx, one.dx, "input gradient");
    for (size_t p = 0; p < one.grads.size(); ++p) expect_close(batched.grads[p], one.grads[p], "parameter gradient");
  }
}

// After the first step, forward and backward allocate no tensor buffer at all, not even one the
// host allocator would serve from its cache: every buffer is kept and reused (ensure_tensor).
TEST(CausalSelfAttention, NoTensorAllocationAfterTheFirstStep) {
  const int64_t B = 2, T = 70, C = 16;
  InitRng rng(6);
  CausalSelfAttention layer(C, 4, T, Device::cpu(), rng, 0.1f);
  const Tensor x = Tensor::from_vector(random_values(static_cast<size_t>(B * T * C), 2), {B, T, C});
  const Tensor dy = Tensor::from_vector(random_values(static_cast<size_t>(B * T * C), 3), {B, T, C});
  for (int step = 0; step < 2; ++step) {
    layer.forward(x);
    layer.backward(dy, true);
  }
  const HostAllocatorStats before = HostAllocator::instance().stats();
  for (int step = 0; step < 3; ++step) {
    layer.forward(x);
    layer.backward(dy, true);
  }
  const HostAllocatorStats after = HostAllocator::instance().stats();
  EXPECT_EQ(after.system_allocs, before.system_allocs);
  EXPECT_EQ(after.cache_hits, before.cache_hits);
}

// The issue's shape, one layer (B=8 T=256 C=256 H=4), forward + backward at 1 thread: prints the
// best of 5 (thread CPU time) beside the same two Linear layers alone (the GEMM-bound part), so the cost of the
// attention itself shows. Not a gate: the machine may be shared.
TEST(CausalSelfAttention, TimeForwardBackwardAtTheIssueShape) {
  const int64_t B = 8, T = 256, C = 256, H = 4;
  set_cpu_threads(1);
  InitRng rng(8);
  CausalSelfAttention layer(C, H, T, Device::cpu(), rng, 0.02f);
  Linear c_attn(C, 3 * C, Device::cpu(), rng), c_proj(C, C, Device::cpu(), rng);
  const Tensor x = Tensor::from_vector(random_values(static_cast<size_t>(B * T * C), 2), {B, T, C});
  const Tensor dy = Tensor::from_vector(random_values(static_cast<size_t>(B * T * C), 3), {B, T, C});
  const Tensor dqkv = Tensor::from_vector(random_values(static_cast<size_t>(B * T * 3 * C), 4), {B * T, 3 * C});
  // The thread's CPU time, not the wall clock: on a machine shared with other jobs the time this
  // thread waited for a core is not counted (its caches are still shared).
  auto cpu_seconds = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  };
  auto best_of = [&](auto&& step) {
    double best = 1e9;
    for (int rep = 0; rep < 6; ++rep) {
      const double start = cpu_seconds();
      step();
      if (rep > 0) best = std::min(best, cpu_seconds() - start);
    }
    return best;
  };
  const double whole = best_of([&] {
    layer.forward(x);
    layer.backward(dy, true);
  });
  const double linears = best_of([&] {
    c_attn.forward(x.view({B * T, C}));
    c_proj.forward(x.view({B * T, C}));
    c_proj.backward(dy.view({B * T, C}), true);
    c_attn.backward(dqkv, true);
  });
  // Model FLOPs as the issue counts them (full T x T products), forward + backward = 3 x forward:
  // per token 2 * 4C^2 for the Linears (3C^2 + C^2 weights) and 2 * 2TC for q k^T and att v.
  const double linear_flops = 3.0 * 2.0 * 4.0 * C * C * B * T, attention_flops = 3.0 * 2.0 * 2.0 * T * C * B * T;
  std::printf("[ attention ] B=%lld T=%lld C=%lld H=%lld, 1 thread, CPU time: fwd+bwd %.2f ms, %.1f model GFLOP/s; "
              "the two Linears alone %.2f ms, %.1f GFLOP/s\n",
              static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(C),
              static_cast<long long>(H), whole * 1e3, (linear_flops + attention_flops) / whole * 1e-9, linears * 1e3,
              linear_flops / linears * 1e-9);
}

}  // namespace
}  // namespace dtrain
