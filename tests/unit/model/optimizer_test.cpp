// Optimizers against PyTorch's update rules written out in double, and LR schedules.
#include <cmath>

#include <gtest/gtest.h>

#include "core/error.h"
#include "model/lr_schedule.h"
#include "model/optimizer.h"

namespace dtrain {
namespace {

struct OneParam {
  Parameter p{"w", Tensor::from_vector(std::vector<float>{1.f, -2.f, 0.5f}, {3}),
              Tensor::zeros({3})};
  void set_grad(std::vector<float> g) { p.grad.copy_from(Tensor::from_vector(g, {3})); }
};

const std::vector<std::vector<float>> kGrads = {{0.1f, -0.2f, 0.3f}, {0.5f, 0.1f, -0.1f}, {-0.3f, 0.2f, 0.05f}};

TEST(Sgd, MomentumNesterovWeightDecayMatchPyTorchRule) {
  for (bool nesterov : {false, true}) {
    const double lr = 0.1, mom = 0.9, wd = 0.01;
    OneParam w;
    Sgd opt({&w.p}, SgdOptions{0.1f, 0.9f, 0.f, 0.01f, nesterov});
    std::vector<double> p = {1, -2, 0.5}, buf(3);
    for (size_t step = 0; step < kGrads.size(); ++step) {
      w.set_grad(kGrads[step]);
      opt.step();
      for (int i = 0; i < 3; ++i) {
        double d = kGrads[step][i] + wd * p[i];
        buf[i] = step == 0 ? d : mom * buf[i] + d;
        d = nesterov ? d + mom * buf[i] : buf[i];
        p[i] -= lr * d;
      }
    }
    std::vector<float> got = w.p.value.to_vector();
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(got[i], p[i], 1e-6) << "nesterov=" << nesterov;
  }
}

TEST(Sgd, PlainAndZeroGrad) {
  OneParam w;
  Sgd opt({&w.p}, SgdOptions{0.5f});
  w.set_grad({1.f, 1.f, 1.f});
  opt.step();
  EXPECT_EQ(w.p.value.to_vector(), (std::vector<float>{0.5f, -2.5f, 0.f}));
  opt.zero_grad();  // lazy: flagged, not cleared
  EXPECT_TRUE(w.p.grad_is_zero);
  opt.step();  // no backward since: the gradient is absent and the parameter stays
  EXPECT_EQ(w.p.value.to_vector(), (std::vector<float>{0.5f, -2.5f, 0.f}));
}

TEST(Optimizers, SkipParametersWithoutGradientLikeSetToNone) {
  // PyTorch's zero_grad(set_to_none=True): a parameter no backward wrote since is left alone,
  // weight decay and momentum included; its momentum starts at its own first update.
  OneParam used, unused;
  Sgd sgd({&used.p, &unused.p}, SgdOptions{0.1f, 0.9f, 0.f, 0.1f, false});
  sgd.zero_grad();
  used.set_grad({1.f, 1.f, 1.f});
  used.p.grad_is_zero = false;  // what a backward does when it writes the gradient
  sgd.step();
  EXPECT_EQ(unused.p.value.to_vector(), (std::vector<float>{1.f, -2.f, 0.5f}));
  EXPECT_NE(used.p.value.to_vector(), (std::vector<float>{1.f, -2.f, 0.5f}));
  OneParam a, b;
  AdamW adamw({&a.p, &b.p}, AdamWOptions{});
  adamw.zero_grad();
  a.set_grad({1.f, 1.f, 1.f});
  a.p.grad_is_zero = false;
  adamw.step();
  EXPECT_EQ(b.p.value.to_vector(), (std::vector<float>{1.f, -2.f, 0.5f}));
}

TEST(AdamW, MatchesDecoupledWeightDecayRule) {
  const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
  OneParam w;
  AdamW opt({&w.p}, AdamWOptions{0.01f, 0.9f, 0.999f, 1e-8f, 0.1f});
  std::vector<double> p = {1, -2, 0.5}, m(3), v(3);
  for (size_t step = 0; step < kGrads.size(); ++step) {
    w.set_grad(kGrads[step]);
    opt.step();
    const double t = static_cast<double>(step + 1);
    for (int i = 0; i < 3; ++i) {
      const double g = kGrads[step][i];
      p[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      p[i] -= lr * (m[i] / (1 - std::pow(b1, t))) / (std::sqrt(v[i] / (1 - std::pow(b2, t))) + eps);
    }
  }
  std::vector<float> got = w.p.value.to_vector();
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(got[i], p[i], 1e-6);
}

// PyTorch computes 1 - beta in double from the value as written and rounds once: after one step
// with gradient 1, exp_avg is float(0.1) and exp_avg_sq float(0.001), to the bit. 1 - 0.999f in
// float is 0.000999987: a 1.3e-5 bias in every second moment (tests/torch/agreement_test.py).
TEST(AdamW, MomentsUseOneMinusBetaAsPyTorchComputesIt) {
  OneParam w;
  AdamW opt({&w.p}, AdamWOptions{0.001f, 0.9f, 0.999f, 1e-8f, 0.01f});
  w.set_grad({1.f, 1.f, 1.f});
  opt.step();
  const OptimizerState state = opt.export_state();
  ASSERT_EQ(state.tensors.size(), 2u);
  EXPECT_EQ(state.tensors[0].value.to_vector()[0], 0.1f);    // w.exp_avg
  EXPECT_EQ(state.tensors[1].value.to_vector()[0], 0.001f);  // w.exp_avg_sq
}

TEST(LrSchedule, StepAndCosine) {
  LrSchedule step{LrSchedule::Kind::kStep, 0.1f, 2, 0.5f};
  EXPECT_FLOAT_EQ(step.lr_at(0), 0.1f);
  EXPECT_FLOAT_EQ(step.lr_at(1), 0.1f);
  EXPECT_FLOAT_EQ(step.lr_at(2), 0.05f);
  EXPECT_FLOAT_EQ(step.lr_at(5), 0.025f);
  LrSchedule cosine{LrSchedule::Kind::kCosine, 0.1f, 1, 0.1f, 4, 0.001f};
  EXPECT_FLOAT_EQ(cosine.lr_at(0), 0.1f);
  EXPECT_NEAR(cosine.lr_at(2), 0.001 + 0.099 * 0.5, 1e-7);
  EXPECT_NEAR(cosine.lr_at(4), 0.001, 1e-7);
  EXPECT_FALSE(parse_lr_schedule_kind("linear").has_value());
  EXPECT_FALSE(parse_lr_schedule_kind("constant").has_value()) << "one name per schedule: none";
  for (auto kind : {LrSchedule::Kind::kConstant, LrSchedule::Kind::kStep, LrSchedule::Kind::kCosine})
    EXPECT_EQ(parse_lr_schedule_kind(lr_schedule_name(kind)), kind);
}

// torch_gpt_peer.py's lr_at (lr 1e-3, min lr/10), printed by Python for these steps.
TEST(StepLrSchedule, WarmupThenCosineAsThePeersLrAt) {
  const StepLrSchedule s{1e-3f, 1e-4f, 10, 50, true};
  const std::vector<std::pair<int64_t, double>> peer = {
      {0, 0.0001}, {1, 0.0002}, {9, 0.001}, {10, 0.001}, {11, 0.0009985407886603944},
      {25, 0.000709572199169141}, {48, 0.00010145921133960553}, {49, 0.0001}};
  for (const auto& [step, lr] : peer) EXPECT_NEAR(s.lr_at(step), lr, 1e-15) << "step " << step;
  EXPECT_NEAR(s.lr_at(60), 0.0001, 1e-15) << "past the last step: min_lr";
  const StepLrSchedule no_warmup{1e-3f, 1e-4f, 0, 5, true};
  const std::vector<double> peer5 = {0.001, 0.0008681980515339464, 0.00055, 0.00023180194846605365, 0.0001};
  for (int64_t step = 0; step < 5; ++step) EXPECT_NEAR(no_warmup.lr_at(step), peer5[step], 1e-15) << step;
  EXPECT_NEAR((StepLrSchedule{1e-3f, 1e-4f, 0, 1, true}.lr_at(0)), 0.001, 1e-15) << "one step: the peer's max(1, ...)";
  const StepLrSchedule constant{1e-3f, 1e-4f, 4, 50, false};
  EXPECT_NEAR(constant.lr_at(1), 0.0005, 1e-15);
  EXPECT_NEAR(constant.lr_at(30), 0.001, 1e-15);
}

// nanoGPT's groups: with decay_matrices_only, a 1-d tensor (bias, LayerNorm) takes no weight
// decay and a 2-d one does; beta2 is the one given.
TEST(AdamW, DecayOnlyOnMatricesAndBeta2) {
  const double lr = 0.01, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  Parameter bias{"b", Tensor::from_vector(std::vector<float>{1.f, -2.f, 0.5f, 3.f}, {4}), Tensor::zeros({4})};
  Parameter weight{"w", Tensor::from_vector(std::vector<float>{1.f, -2.f, 0.5f, 3.f}, {2, 2}), Tensor::zeros({2, 2})};
  AdamWOptions o{0.01f, 0.9f, 0.95f, 1e-8f, 0.1f};
  o.decay_matrices_only = true;
  AdamW opt({&bias, &weight}, o);
  const std::vector<float> g = {0.1f, -0.2f, 0.3f, 0.4f};
  std::vector<double> pb = {1, -2, 0.5, 3}, pw = pb;
  for (int step = 0; step < 3; ++step) {
    bias.grad.copy_from(Tensor::from_vector(g, {4}));
    weight.grad.copy_from(Tensor::from_vector(g, {2, 2}));
    bias.grad_is_zero = weight.grad_is_zero = false;
    opt.step();
  }
  for (std::vector<double>* p : {&pb, &pw}) {
    std::vector<double> m(4), v(4);
    for (int step = 0; step < 3; ++step) {
      const double t = step + 1;
      for (int i = 0; i < 4; ++i) {
        if (p == &pw) (*p)[i] *= 1 - lr * wd;
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
        (*p)[i] -= lr * (m[i] / (1 - std::pow(b1, t))) / (std::sqrt(v[i] / (1 - std::pow(b2, t))) + eps);
      }
    }
  }
  const std::vector<float> got_b = bias.value.to_vector(), got_w = weight.value.to_vector();
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(got_b[i], pb[i], 1e-6) << "bias " << i << ": no decay";
    EXPECT_NEAR(got_w[i], pw[i], 1e-6) << "weight " << i << ": decayed";
  }
}

// The same groups with SGD (--model gpt --optimizer sgd --weight-decay): L2 decay on the 2-d
// tensor only, the 1-d one steps on its gradient alone.
TEST(Sgd, DecayOnlyOnMatrices) {
  const float lr = 0.1f, wd = 0.5f;
  Parameter bias{"b", Tensor::from_vector(std::vector<float>{1.f, -2.f, 0.5f, 3.f}, {4}), Tensor::zeros({4})};
  Parameter weight{"w", Tensor::from_vector(std::vector<float>{1.f, -2.f, 0.5f, 3.f}, {2, 2}), Tensor::zeros({2, 2})};
  SgdOptions o{lr, 0.f, 0.f, wd, false};
  o.decay_matrices_only = true;
  Sgd opt({&bias, &weight}, o);
  const std::vector<float> g = {0.1f, -0.2f, 0.3f, 0.4f}, p0 = {1.f, -2.f, 0.5f, 3.f};
  bias.grad.copy_from(Tensor::from_vector(g, {4}));
  weight.grad.copy_from(Tensor::from_vector(g, {2, 2}));
  bias.grad_is_zero = weight.grad_is_zero = false;
  opt.step();
  const std::vector<float> got_b = bias.value.to_vector(), got_w = weight.value.to_vector();
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(got_b[i], p0[i] - lr * g[i], 1e-6) << "bias " << i << ": no decay";
    EXPECT_NEAR(got_w[i], p0[i] - lr * (g[i] + wd * p0[i]), 1e-6) << "weight " << i << ": decayed";
  }
}

}  // namespace
}  // namespace dtrain
