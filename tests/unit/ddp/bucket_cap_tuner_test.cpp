// --bucket-cap-mb auto's bookkeeping: warm-up steps are not measured, each candidate's median
// is kept, and the choice is the candidate whose slowest rank is fastest.
#include <gtest/gtest.h>

#include "core/error.h"
#include "ddp/bucket_cap_tuner.h"

namespace dtrain {
namespace {

TEST(BucketCapTuner, SkipsWarmUpStepsAndKeepsEachCandidatesMedian) {
  BucketCapTuner tuner({{1, 1}, {2, 2}}, /*warmup_steps=*/1, /*measured_steps=*/3);
  EXPECT_EQ(tuner.current(), 0u);
  EXPECT_FALSE(tuner.record(100.0));  // warm-up: a rebuild's first step pays for cold caches
  EXPECT_FALSE(tuner.record(3.0));
  EXPECT_FALSE(tuner.record(1.0));
  EXPECT_TRUE(tuner.record(2.0));
  EXPECT_EQ(tuner.current(), 1u);
  EXPECT_FALSE(tuner.finished());
  for (double ms : {50.0, 5.0, 7.0}) EXPECT_FALSE(tuner.record(ms));
  EXPECT_TRUE(tuner.record(6.0));
  EXPECT_TRUE(tuner.finished());
  EXPECT_EQ(tuner.medians(), (std::vector<double>{2.0, 6.0}));
  EXPECT_THROW(tuner.record(1.0), Error);
}

TEST(BucketCapTuner, ChoosesTheCandidateWhoseSlowestRankIsFastest) {
  // Rank 0 alone would choose candidate 0; rank 1 makes it the slowest.
  EXPECT_EQ(choose_fastest_candidate({{1.0, 5.0, 9.0}, {10.0, 6.0, 4.0}}), 1u);
  EXPECT_EQ(choose_fastest_candidate({{3.0, 3.0}, {2.0, 3.0}}), 0u) << "ties go to the earlier candidate";
  EXPECT_THROW(choose_fastest_candidate({{1.0, 2.0}, {1.0}}), Error);
}

TEST(BucketCapTuner, DefaultCandidatesIncludePyTorchsDefaultAndOneLargeBucket) {
  const auto c = default_bucket_cap_candidates();
  EXPECT_NE(std::find(c.begin(), c.end(), BucketCaps{1u << 20, 16u << 20}), c.end());
  EXPECT_EQ(c.back(), (BucketCaps{64u << 20, 64u << 20}));
}

}  // namespace
}  // namespace dtrain
