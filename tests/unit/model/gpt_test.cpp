// The GPT model: nanoGPT's parameter names and shapes, the plan and its one-line refusals,
// GPT-2's initialisation, the gradient-ready hooks (reverse block order, each parameter once,
// wte last), the whole model against finite differences, zero_grad semantics and autocast.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "core/error.h"
#include "core/host_allocator.h"
#include "gradcheck.h"
#include "model/gpt.h"
#include "model/loss.h"

namespace dtrain {
namespace {

using testing::random_values;

// The whole-model check's configuration (issue 21): V=11 T=5 L=2 H=2 C=8.
GptSpec tiny() { return GptSpec{11, 5, 2, 2, 8}; }

Tensor tokens_tensor(const std::vector<int32_t>& ids, int64_t batch, int64_t seq) {
  Tensor t = Tensor::empty({batch, seq}, Device::cpu(), DType::kI32);
  std::memcpy(t.data_as<int32_t>(), ids.data(), ids.size() * sizeof(int32_t));
  return t;
}

std::vector<std::string> expected_names(int64_t layers) {
  std::vector<std::string> n = {"transformer.wte.weight", "transformer.wpe.weight"};
  for (int64_t i = 0; i < layers; ++i)
    for (const char* s : {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                          "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                          "mlp.c_proj.weight", "mlp.c_proj.bias"})
      n.push_back("transformer.h." + std::to_string(i) + "." + s);
  n.push_back("transformer.ln_f.weight");
  n.push_back("transformer.ln_f.bias");
  return n;
}

TEST(Gpt, ParametersHaveNanoGptNamesAndShapesAsPlanned) {
  const GptSpec spec = tiny();
  auto model = build_gpt(spec, Device::cpu(), 1);
  auto params = model->parameters();
  std::vector<std::string> names;
  for (Parameter* p : params) names.push_back(p->name);
  EXPECT_EQ(names, expected_names(2));
  std::vector<ParameterShape> planned;
  for (const LayerSize& l : plan_gpt(spec))
    for (const ParameterShape& t : l.tensors) planned.push_back(t);
  ASSERT_EQ(planned.size(), params.size());
  int64_t count = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(planned[i].name, params[i]->name);
    EXPECT_EQ(planned[i].shape, params[i]->value.shape()) << params[i]->name;
    EXPECT_EQ(params[i]->grad.shape(), params[i]->value.shape()) << params[i]->name;
    count += params[i]->value.numel();
  }
  // wte 11x8 + wpe 5x8 + 2 blocks x (2x16 + 24x8+24 + 8x8+8 + 32x8+32 + 8x32+8) + ln_f 16
  EXPECT_EQ(count, 88 + 40 + 2 * (32 + 216 + 72 + 288 + 264) + 16);
  EXPECT_EQ(gpt_parameter_count(spec), count);
  // Linear weights are [out, in] as PyTorch's
  EXPECT_EQ(params[4]->value.shape(), (Shape{24, 8}));   // attn.c_attn.weight [3C, C]
  EXPECT_EQ(params[10]->value.shape(), (Shape{32, 8}));  // mlp.c_fc.weight [4C, C]
  EXPECT_EQ(params[12]->value.shape(), (Shape{8, 32}));  // mlp.c_proj.weight [C, 4C]
}

TEST(Gpt, GptTwoSmallHasGptTwoSmallsParameterCount) {
  // GPT-2 124M (V=50257, T=1024, L=12, H=12, C=768): 124,439,808 parameters with wte counted once.
  EXPECT_EQ(gpt_parameter_count(GptSpec{50257, 1024, 12, 12, 768}), 124439808);
}

void expect_refused(const GptSpec& spec, const std::string& words) {
  try {
    plan_gpt(spec);
    ADD_FAILURE() << "accepted a spec that should be refused: " << words;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(words), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << what;
  }
  EXPECT_THROW(build_gpt(spec, Device::cpu(), 1), Error);
}

TEST(Gpt, BadSpecsAreOneLineEach) {
  expect_refused(GptSpec{0, 5, 2, 2, 8}, "vocabulary (--vocab) must be at least 1, got 0");
  expect_refused(GptSpec{11, 0, 2, 2, 8}, "context (--context) must be at least 1, got 0");
  expect_refused(GptSpec{11, 5, 0, 2, 8}, "layer count (--layers) must be at least 1, got 0");
  expect_refused(GptSpec{11, 5, 2, -1, 8}, "head count (--heads) must be at least 1, got -1");
  expect_refused(GptSpec{11, 5, 2, 2, 0}, "embedding width (--embd) must be at least 1, got 0");
  expect_refused(GptSpec{11, 5, 2, 3, 8}, "embedding width 8 (--embd) is not divisible by the head count 3 (--heads)");
  expect_refused(GptSpec{int64_t{1} << 31, 5, 2, 2, 8}, "exceeds int32 token ids");
}

TEST(Gpt, AModelThatDoesNotFitItsBudgetIsRefusedBeforeAllocating) {
  try {
    build_gpt(GptSpec{50257, 1024, 12, 12, 768}, Device::cpu(), 1, int64_t{1} << 30);
    ADD_FAILURE() << "GPT-2 124M fitted in 1 GiB of training state";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kResources);
    EXPECT_NE(what.find("gpt needs"), std::string::npos) << what;
    EXPECT_NE(what.find("124439808 parameters"), std::string::npos) << what;
    EXPECT_NE(what.find("TokenEmbedding(vocab=50257"), std::string::npos) << what;  // its largest part
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

double mean_of(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += x;
  return s / static_cast<double>(v.size());
}

double std_of(const std::vector<float>& v) {
  const double m = mean_of(v);
  double s = 0;
  for (float x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size()));
}

TEST(Init, NormalDrawsAreStandardNormalAndSeeded) {
  InitRng a(3), b(3), c(4);
  std::vector<float> x(200000);
  for (float& v : x) v = a.normal(0.f, 1.f);
  EXPECT_NEAR(mean_of(x), 0.0, 0.01);
  EXPECT_NEAR(std_of(x), 1.0, 0.01);
  size_t beyond3 = std::count_if(x.begin(), x.end(), [](float v) { return std::abs(v) > 3.f; });
  EXPECT_NEAR(static_cast<double>(beyond3) / x.size(), 0.0027, 0.0006);  // the normal's tails
  EXPECT_EQ(b.normal(0.f, 1.f), x[0]);
  EXPECT_NE(c.normal(0.f, 1.f), x[0]);
}

TEST(Gpt, InitialisationIsGptTwos) {
  const GptSpec spec{256, 64, 2, 2, 64};
  auto model = build_gpt(spec, Device::cpu(), 7);
  const double proj = 0.02 / std::sqrt(4.0);
  for (Parameter* p : model->parameters()) {
    const std::vector<float> v = p->value.to_vector();
    const std::string& n = p->name;
    auto ends = [&](const std::string& s) { return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0; };
    if (n.find(".ln_") != std::string::npos || n.find("ln_f") != std::string::npos) {
      for (float x : v) EXPECT_EQ(x, ends(".weight") ? 1.f : 0.f) << n;
    } else if (ends(".bias")) {
      for (float x : v) EXPECT_EQ(x, 0.f) << n;
    } else {
      const double want = ends("c_proj.weight") ? proj : 0.02;
      EXPECT_NEAR(mean_of(v), 0.0, 4 * want / std::sqrt(double(v.size()))) << n;
      EXPECT_NEAR(std_of(v), want, 0.05 * want) << n;
    }
  }
  // The same seed gives the same weights; another seed others.
  auto again = build_gpt(spec, Device::cpu(), 7), other = build_gpt(spec, Device::cpu(), 8);
  EXPECT_EQ(model->parameters()[0]->value.to_vector(), again->parameters()[0]->value.to_vector());
  EXPECT_NE(model->parameters()[0]->value.to_vector(), other->parameters()[0]->value.to_vector());
}

// Every parameter uniform in [-0.5, 0.5] (LayerNorm weights in [0.5, 1.5]): the GPT-2 init's
// small weights would leave most sensitivities near zero, where a relative check says little.
void randomise(Gpt& model) {
  uint32_t seed = 100;
  for (Parameter* p : model.parameters()) {
    const bool ln_weight = p->name.find("ln_") != std::string::npos && p->name.ends_with(".weight");
    p->value.copy_from(Tensor::from_vector(
        random_values(static_cast<size_t>(p->value.numel()), seed++, ln_weight ? 0.5f : -0.5f, ln_weight ? 1.5f : 0.5f),
        p->value.shape()));
  }
}

// The whole model against central differences on every parameter, wte included (it gets the
// head's and the embedding's contributions: Note [Tied embedding gradient]). Tokens repeat
// (two contributions to a wte row from the embedding) and one token is absent (the head's only).
TEST(GradCheck, WholeGpt) {
  auto model = build_gpt(tiny(), Device::cpu(), 3);
  randomise(*model);
  const Tensor tokens = tokens_tensor({1, 4, 4, 9, 0, 10, 2, 4, 7, 7}, 2, 5);  // no 3, 5, 6, 8
  testing::expect_gradients_match(*model, tokens, 3e-3f, 3e-3, 3e-3, false);
}

// The model's hooks fire as backward runs: ln_f first, then the blocks from last to first, then
// wpe and finally wte; within that, exactly the reverse of parameters(), each parameter once.
TEST(Gpt, GradReadyHooksFireInReverseParameterOrderOncePerBackward) {
  auto model = build_gpt(GptSpec{11, 5, 3, 2, 8}, Device::cpu(), 2);
  std::vector<std::string> fired;
  model->set_grad_ready_hook([&](Parameter& p) { fired.push_back(p.name); });
  CrossEntropyLoss loss;
  const Tensor tokens = tokens_tensor({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 2, 5);
  const Tensor targets = tokens_tensor({2, 3, 4, 5, 6, 7, 8, 9, 10, 0}, 10, 1).view({10});
  std::vector<std::string> reversed = expected_names(3);
  std::reverse(reversed.begin(), reversed.end());
  for (int step = 0; step < 2; ++step) {
    fired.clear();
    loss.forward(model->forward(tokens), targets);
    model->backward(loss.backward());
    EXPECT_EQ(fired, reversed) << "step " << step;
  }
}

// A block's parameters are ready while backward is still in the blocks before it: when a hook
// of block i fires, that parameter's gradient is final (finite) and block i-1's gradients are
// not yet written (still the NaN left there), so DDP's bucket all-reduce overlaps the rest.
TEST(Gpt, ABlocksHooksFireBeforeTheBlockBeforeItRunsItsBackward) {
  auto model = build_gpt(GptSpec{11, 5, 3, 2, 8}, Device::cpu(), 2);
  std::map<std::string, Parameter*> by_name;
  for (Parameter* p : model->parameters()) {
    by_name[p->name] = p;
    p->grad.copy_from(Tensor::from_vector(std::vector<float>(p->grad.numel(), NAN), p->grad.shape()));
    p->grad_is_zero = true;
  }
  int checked = 0;
  model->set_grad_ready_hook([&](Parameter& p) {
    for (float v : p.grad.to_vector()) ASSERT_TRUE(std::isfinite(v)) << p.name;
    for (int i = 1; i < 3; ++i) {
      if (p.name.rfind("transformer.h." + std::to_string(i) + ".", 0) != 0) continue;
      const Parameter* earlier = by_name["transformer.h." + std::to_string(i - 1) + ".mlp.c_proj.bias"];
      EXPECT_TRUE(std::isnan(earlier->grad.to_vector()[0])) << p.name << " fired after block " << i - 1 << " ran";
      ++checked;
    }
  });
  CrossEntropyLoss loss;
  loss.forward(model->forward(tokens_tensor({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 2, 5)),
               tokens_tensor({2, 3, 4, 5, 6, 7, 8, 9, 10, 0}, 10, 1).view({10}));
  model->backward(loss.backward());
  EXPECT_EQ(checked, 2 * 12);
}

// After zero_grad (grad_is_zero) the gradients' memory is stale, here NaN: the first backward
// overwrites every gradient, and the next accumulates onto it.
TEST(Gpt, BackwardAfterZeroGradOverwritesStaleMemoryThenAccumulates) {
  auto model = build_gpt(tiny(), Device::cpu(), 4);
  const Tensor tokens = tokens_tensor({1, 4, 4, 9, 0, 10, 2, 4, 7, 7}, 2, 5);
  const Tensor targets = tokens_tensor({4, 4, 9, 0, 10, 2, 4, 7, 7, 1}, 10, 1).view({10});
  for (Parameter* p : model->parameters()) {
    p->grad.copy_from(Tensor::from_vector(std::vector<float>(p->grad.numel(), NAN), p->grad.shape()));
    p->grad_is_zero = true;
  }
  CrossEntropyLoss loss;
  loss.forward(model->forward(tokens), targets);
  model->backward(loss.backward());
  std::map<std::string, std::vector<float>> once;
  for (Parameter* p : model->parameters()) {
    once[p->name] = p->grad.to_vector();
    for (float v : once[p->name]) ASSERT_TRUE(std::isfinite(v)) << p->name;
  }
  loss.forward(model->forward(tokens), targets);
  model->backward(loss.backward());
  for (Parameter* p : model->parameters()) {
    const std::vector<float> twice = p->grad.to_vector();
    for (size_t i = 0; i < twice.size(); ++i)
      ASSERT_NEAR(twice[i], 2 * once[p->name][i], 1e-6 + 1e-5 * std::abs(twice[i])) << p->name << "[" << i << "]";
  }
}

TEST(Gpt, ForwardGivesLogitsPerPositionAndAcceptsShorterSequences) {
  auto model = build_gpt(tiny(), Device::cpu(), 5);
  EXPECT_EQ(model->forward(tokens_tensor({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 2, 5)).shape(), (Shape{10, 11}));
  EXPECT_EQ(model->forward(tokens_tensor({1, 2, 3, 4, 5, 6}, 2, 3)).shape(), (Shape{6, 11}));
  EXPECT_THROW(model->forward(tokens_tensor({1, 2, 3, 4, 5, 6}, 1, 6)), Error);  // T > context
  // At GPT-2's init the logits are near zero: the loss starts near log(V).
  CrossEntropyLoss loss;
  const float l = loss_value(loss.forward(model->forward(tokens_tensor({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 2, 5)),
                                          tokens_tensor({2, 3, 4, 5, 6, 7, 8, 9, 10, 0}, 10, 1).view({10})));
  EXPECT_NEAR(l, std::log(11.f), 0.05f);
}

// Largest |a - b| relative to the largest |a|.
double rel_change(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(double(a[i]) - b[i]));
    scale = std::max(scale, std::abs(double(a[i])));
  }
  return worst / scale;
}

// --amp bf16 reaches every block's GEMMs and the head: each output moves by bf16 rounding, no more.
// Note [Backward scratch] (model/module.h): the blocks' backward scratch is shared, so a block more
// takes no new memory from the system in backward on the first step (its forward activations,
// which backward needs, it does take). Counted as the host allocator's system allocations, L = 4
// against L = 3 (from 3 blocks on, every block's backward finds its buffers in the cache).
TEST(Gpt, ABlockMoreTakesNoNewMemoryInBackward) {
  struct Allocs {
    int64_t forward, backward;
  };
  auto first_step = [](int64_t layers) {
    HostAllocator& host = HostAllocator::instance();
    host.release_cached();  // what earlier tests left must not serve this model
    Gpt model(GptSpec{16, 8, layers, 2, 8}, Device::cpu(), 1);
    std::vector<int32_t> ids(16);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i * 5 % 16);
    CrossEntropyLoss loss;
    const int64_t s0 = host.stats().system_allocs;
    const Tensor logits = model.forward(tokens_tensor(ids, 2, 8));
    loss.forward(logits, tokens_tensor(ids, 16, 1).view({16}));
    const int64_t s1 = host.stats().system_allocs;
    model.backward(loss.backward());
    const int64_t s2 = host.stats().system_allocs;
    return Allocs{s1 - s0, s2 - s1};
  };
  const Allocs three = first_step(3), four = first_step(4);
  EXPECT_GT(four.forward, three.forward);  // the extra block's activations
  EXPECT_EQ(four.backward, three.backward);
}

TEST(Gpt, Bf16AutocastReachesTheBlocksAndTheHeadWithinBf16Rounding) {
  auto model = build_gpt(tiny(), Device::cpu(), 6);
  randomise(*model);
  const Tensor tokens = tokens_tensor({1, 4, 4, 9, 0, 10, 2, 4, 7, 7}, 2, 5);
  const Tensor x = Tensor::from_vector(random_values(2 * 5 * 8, 21), {2, 5, 8});
  const std::vector<float> logits32 = model->forward(tokens).to_vector();
  std::vector<std::vector<float>> blocks32;
  for (size_t i = 0; i < 2; ++i) blocks32.push_back(model->block(i).forward(x).to_vector());
  model->set_amp(AmpMode::kBf16);
  const double logits_change = rel_change(logits32, model->forward(tokens).to_vector());
  EXPECT_GT(logits_change, 0.0);
  EXPECT_LT(logits_change, 0.05);
  for (size_t i = 0; i < 2; ++i) {
    const double change = rel_change(blocks32[i], model->block(i).forward(x).to_vector());
    EXPECT_GT(change, 0.0) << "block " << i;
    EXPECT_LT(change, 0.05) << "block " << i;
  }
}

}  // namespace
}  // namespace dtrain
