// Note [Stopping on non-finite values]: the loss watch in both of its modes (read every step;
// summed on the device and read at votes), and the line a diverged run prints.
#include "app/divergence.h"

#include <cmath>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

namespace dtrain {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

Tensor loss(float v) {
  const std::vector<float> values{v};
  return Tensor::from_vector(values, {1});
}

TEST(LossWatch, ReadEveryStepNamesTheFirstNonFiniteStepAndKeepsIt) {
  LossWatch watch(Device::cpu(), true);
  watch.record(loss(2.3f), {1, 0, 1});
  EXPECT_FALSE(watch.check().found);
  watch.record(loss(1e30f), {2, 0, 2});
  watch.record(loss(kInf), {3, 0, 3});
  watch.record(loss(kNan), {4, 0, 4});
  const LossFinding f = watch.check();
  ASSERT_TRUE(f.found);
  EXPECT_TRUE(f.exact);
  EXPECT_EQ(f.first.step, 3);
  EXPECT_TRUE(std::isinf(f.value));
  watch.record(loss(1.f), {5, 0, 5});
  EXPECT_EQ(watch.check().first.step, 3);  // kept: a later finite loss does not undo it
}

// The device mode (run here on the CPU): the range of steps since the last finite check.
TEST(LossWatch, ASumReadAtVotesNamesTheRangeSinceTheLastFiniteCheck) {
  LossWatch watch(Device::cpu(), false);
  watch.record(loss(2.3f), {1, 0, 1});
  watch.record(loss(2.2f), {2, 0, 2});
  EXPECT_FALSE(watch.check().found);
  watch.record(loss(2.1f), {3, 0, 3});
  watch.record(loss(-kInf), {4, 0, 4});
  watch.record(loss(2.0f), {5, 0, 5});
  const LossFinding f = watch.check();
  ASSERT_TRUE(f.found);
  EXPECT_FALSE(f.exact);
  EXPECT_EQ(f.first.step, 3);
  EXPECT_EQ(f.last.step, 5);
  EXPECT_TRUE(std::isinf(f.value) && f.value < 0);
  LossWatch quiet(Device::cpu(), false);
  quiet.record(loss(1.f), {1, 0, 1});
  EXPECT_FALSE(quiet.check().found);
  EXPECT_FALSE(quiet.check().found);  // nothing recorded since: nothing read
}

// On one GPU rank every boundary votes: the sum is read once a period, and always when a check
// must (before a save, at the end), so a NaN never passes a save unread.
TEST(LossWatch, ASumIsReadOncePerPeriodUnlessACheckMust) {
  LossWatch watch(Device::cpu(), false, 60'000);
  watch.record(loss(kNan), {1, 0, 1});
  EXPECT_FALSE(watch.check(false).found);  // within the period: not read
  const LossFinding f = watch.check(true);
  ASSERT_TRUE(f.found);
  EXPECT_EQ(f.first.step, 1);
  EXPECT_TRUE(f.exact);
}

TEST(DivergenceLine, NamesTheEarliestLossTheRanksThatSawOneAndTheCheckpoints) {
  std::vector<LossFinding> ranks(3);
  ranks[1] = {true, true, kNan, {9, 1, 2}, {9, 1, 2}};
  ranks[2] = {true, true, kInf, {7, 0, 7}, {7, 0, 7}};
  EXPECT_EQ(divergence_line(ranks, "", {9, 1, 2}, "no checkpoint written from it (newest: ck/step-6)"),
            "training diverged: the loss is inf at step 7 (epoch 1, batch 7) on rank(s) 1, 2; no checkpoint written "
            "from it (newest: ck/step-6)");
}

TEST(DivergenceLine, ARangeOfStepsOnADevice) {
  const std::vector<LossFinding> ranks = {{true, false, kNan, {51, 0, 51}, {100, 0, 100}}};
  EXPECT_EQ(divergence_line(ranks, "", {100, 0, 100}, "nothing saved (no --checkpoint-dir)"),
            "training diverged: the loss is nan at a step from 51 (epoch 1, batch 51) to 100 on rank(s) 0; nothing "
            "saved (no --checkpoint-dir)");
}

// NaN weights can give a finite loss (ReLU(NaN) is 0): then the snapshot's check names them.
TEST(DivergenceLine, ANonFiniteSnapshotWithAFiniteLoss) {
  const std::vector<LossFinding> ranks(2);
  EXPECT_EQ(divergence_line(ranks, "model.safetensors: 1.weight: 200704 non-finite value(s) (first: nan at index 0)",
                            {16, 0, 16}, "no checkpoint written from it (none in ck yet)"),
            "training diverged: the state to checkpoint is not finite after step 16 (epoch 1, batch 16): "
            "model.safetensors: 1.weight: 200704 non-finite value(s) (first: nan at index 0); no checkpoint written "
            "from it (none in ck yet)");
}

}  // namespace
}  // namespace dtrain
