// GradScaler (model/grad_scaler.h): PyTorch's dynamic loss-scaling rule step for step, the
// unscale-and-check pass, and a training run with injected infinite gradients whose scale
// trajectory and skipped steps equal an independent reimplementation of torch.cuda.amp.GradScaler.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "core/ops.h"
#include "model/grad_scaler.h"
#include "model/loss.h"
#include "model/models.h"
#include "model/optimizer.h"

namespace dtrain {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// torch.cuda.amp.GradScaler.update() as its documentation states it, written out here apart
// from the library: on an inf/NaN, scale * backoff and the streak restarts; else after
// growth_interval unskipped steps in a row, scale * growth (kept only if finite).
struct ReferenceScaler {
  float scale = 65536.f;
  int64_t streak = 0;
  int64_t interval = 2000;
  void update(bool found_inf) {
    if (found_inf) {
      scale *= 0.5f;
      streak = 0;
      return;
    }
    if (++streak < interval) return;
    streak = 0;
    if (std::isfinite(scale * 2.f)) scale *= 2.f;
  }
};

TEST(GradScalerRule, FollowsTorchsRuleStepForStep) {
  for (int64_t interval : {1, 2, 3, 7, 2000}) {
    GradScalerSettings settings;
    settings.growth_interval = interval;
    GradScalerState s;
    ReferenceScaler ref;
    ref.interval = interval;
    std::mt19937 gen(static_cast<unsigned>(interval));
    std::bernoulli_distribution inf_now(0.15);
    int64_t skipped = 0;
    for (int step = 0; step < 5000; ++step) {
      const bool found = inf_now(gen);
      skipped += found;
      s = next_scaler_state(s, found, settings);
      ref.update(found);
      ASSERT_EQ(s.scale, ref.scale) << "interval " << interval << " step " << step;
      ASSERT_EQ(s.growth_tracker, ref.streak) << "interval " << interval << " step " << step;
      ASSERT_EQ(s.skipped_steps, skipped);
    }
  }
}

TEST(GradScalerRule, NeverGrowsToInfinityAndFixedScaleStaysPut) {
  GradScalerSettings settings;
  settings.growth_interval = 1;
  GradScalerState s{FLT_MAX, 0, 0};
  s = next_scaler_state(s, false, settings);
  EXPECT_EQ(s.scale, FLT_MAX) << "x2 would overflow: kept, as PyTorch keeps it";
  EXPECT_EQ(s.growth_tracker, 0);
  settings.dynamic = false;
  GradScalerState f{1024.f, 0, 0};
  f = next_scaler_state(f, true, settings);
  f = next_scaler_state(f, false, settings);
  EXPECT_EQ(f.scale, 1024.f);
  EXPECT_EQ(f.skipped_steps, 1) << "a fixed scale still counts (and skips) the step";
}

TEST(GradScaler, UnscaleMultipliesByTheInverseAndCountsNonFinite) {
  GradScaler scaler(GradScalerSettings{}, Device::cpu());
  std::vector<float> a(5000, 65536.f), b = {131072.f, -3.f * 65536.f};
  std::vector<GradSpan> spans = {{a.data(), static_cast<int64_t>(a.size())}, {b.data(), 2}};
  scaler.unscale(spans);
  EXPECT_EQ(scaler.read_found_inf(), 0.f);
  for (float v : a) ASSERT_EQ(v, 1.f);
  EXPECT_EQ(b, (std::vector<float>{2.f, -3.f}));
  for (float bad : {kInf, -kInf, std::nanf("")}) {
    a.assign(5000, 1.f);
    a[4321] = bad;
    scaler.unscale(spans);
    EXPECT_GT(scaler.read_found_inf(), 0.f) << bad;
    EXPECT_EQ(a[0], 1.f / 65536.f);
  }
  // A finite value as large as float allows is no overflow.
  a.assign(5000, FLT_MAX);
  scaler.unscale(spans);
  EXPECT_EQ(scaler.read_found_inf(), 0.f);
  scaler.unscale({});
  EXPECT_EQ(scaler.read_found_inf(), 0.f) << "no gradients: nothing found";
}

TEST(GradScaler, AbsentGradientsAreNotChecked) {
  Parameter p{"w", Tensor::zeros({3}, Device::cpu()), Tensor::from_vector(std::vector<float>{kInf, 1.f, 2.f}, {3})};
  p.grad_is_zero = true;  // zero_grad(): its memory holds last step's values
  EXPECT_TRUE(written_grads({&p}).empty());
  p.grad_is_zero = false;
  EXPECT_EQ(written_grads({&p}).size(), 1u);
}

// An fp16 MLP trained with loss scaling; the gradients of `poisoned` steps get an infinity
// after backward (as an fp16 overflow would leave them). Returns the scale after each step.
std::vector<float> scaled_run(const std::set<int>& poisoned, int steps, int64_t interval, int* skipped_ok) {
  auto model = build_model(ModelSpec{ModelKind::kMlp, {32}}, {12}, 4, Device::cpu(), 5);
  model->set_amp(AmpMode::kFp16);
  Sgd opt(model->parameters(), SgdOptions{0.1f, 0.9f});
  GradScalerSettings settings;
  settings.growth_interval = interval;
  GradScaler scaler(settings, Device::cpu());
  CrossEntropyLoss loss_fn;
  std::mt19937 gen(9);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> scales;
  *skipped_ok = 1;
  for (int step = 1; step <= steps; ++step) {
    std::vector<float> xs(16 * 12);
    for (float& v : xs) v = normal(gen);
    Tensor y = Tensor::empty({16}, Device::cpu(), DType::kI32);
    for (int i = 0; i < 16; ++i) y.data_as<int32_t>()[i] = (i + step) % 4;
    opt.zero_grad();
    loss_fn.forward(model->forward(Tensor::from_vector(xs, {16, 12})), y);
    Tensor grad = loss_fn.backward();
    scale(grad, scaler.scale());
    model->backward(grad, false);
    if (poisoned.count(step)) model->parameters()[2]->grad.data()[7] = kInf;
    const std::vector<float> before = model->parameters()[0]->value.to_vector();
    scaler.unscale(written_grads(model->parameters()));
    const bool take = scaler.update(scaler.read_found_inf() > 0.f);
    if (take) opt.step();
    const bool moved = model->parameters()[0]->value.to_vector() != before;
    if (moved != take) *skipped_ok = 0;
    scales.push_back(scaler.scale());
  }
  return scales;
}

TEST(GradScaler, TrajectoryWithInjectedInfsEqualsTorchsRule) {
  const std::set<int> poisoned = {2, 5, 6, 13, 14, 15, 30};
  constexpr int kSteps = 40;
  constexpr int64_t kInterval = 4;  // growth is exercised too
  int skipped_ok = 0;
  const std::vector<float> got = scaled_run(poisoned, kSteps, kInterval, &skipped_ok);
  ReferenceScaler ref;
  ref.interval = kInterval;
  std::vector<float> want;
  for (int step = 1; step <= kSteps; ++step) {
    ref.update(poisoned.count(step) > 0);
    want.push_back(ref.scale);
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(skipped_ok, 1) << "parameters move exactly on the steps taken";
  EXPECT_GT(*std::max_element(got.begin() + 20, got.end()), 65536.f / 8) << "the scale grew back";
}

}  // namespace
}  // namespace dtrain
