// The bucket plan: reverse parameter order, first bucket 1 MiB, then the cap; every parameter
// exactly once.
#include <gtest/gtest.h>

#include "ddp/bucket_plan.h"

namespace dtrain {
namespace {

TEST(BucketPlan, ReverseOrderFirstBucketSmallThenCap) {
  const size_t MiB = 1u << 20;
  // Parameters (forward order): 3 MiB, 4 KiB, 10 MiB, 8 KiB, 300 KiB, 40 B
  std::vector<size_t> bytes = {3 * MiB, 4096, 10 * MiB, 8192, 300 * 1024, 40};
  auto plan = compute_bucket_plan(bytes);
  // Reverse: 40 B, 300 KiB, 8 KiB, 10 MiB -> first bucket reaches 1 MiB at the 10 MiB tensor.
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0], (std::vector<size_t>{5, 4, 3, 2}));
  EXPECT_EQ(plan[1], (std::vector<size_t>{1, 0}));
}

TEST(BucketPlan, SmallCapsSplitEveryTensor) {
  std::vector<size_t> bytes = {100, 100, 100};
  auto plan = compute_bucket_plan(bytes, 50, 50);
  EXPECT_EQ(plan, (std::vector<std::vector<size_t>>{{2}, {1}, {0}}));
}

TEST(BucketPlan, EverythingFitsInOneBucket) {
  std::vector<size_t> bytes = {784 * 256 * 4, 256 * 4, 2560 * 4, 40};  // the seed MLP, 795 KiB
  auto plan = compute_bucket_plan(bytes);
  EXPECT_EQ(plan, (std::vector<std::vector<size_t>>{{3, 2, 1, 0}}));
}

TEST(BucketPlan, EmptyModel) { EXPECT_TRUE(compute_bucket_plan({}).empty()); }

}  // namespace
}  // namespace dtrain

namespace dtrain {
namespace {

TEST(BucketPlan, FollowsTheOrderGradientsBecameReady) {
  // A model whose last layer (parameters 4, 5) finished late: its gradients open no bucket of
  // their own at the front, they close the last one.
  std::vector<size_t> bytes = {400, 40, 300, 30, 200, 20};
  auto plan = compute_bucket_plan(bytes, {3, 2, 1, 0, 5, 4}, 100, 300);
  EXPECT_EQ(plan, (std::vector<std::vector<size_t>>{{3, 2}, {1, 0}, {5, 4}}));
  EXPECT_EQ(compute_bucket_plan(bytes, reverse_parameter_order(6), 100, 300), compute_bucket_plan(bytes, 100, 300));
}

TEST(BucketPlan, AReadyOrderMustBeAPermutationOfTheParameters) {
  EXPECT_EQ(check_ready_order({2, 0, 1}, 3), "");
  EXPECT_EQ(check_ready_order({0, 1}, 3), "2 parameter indices for a model of 3 parameters");
  EXPECT_EQ(check_ready_order({0, 1, 1}, 3), "parameter index 1 appears twice");
  EXPECT_EQ(check_ready_order({0, 1, 3}, 3), "parameter index 3 is out of range (the model has 3)");
}

TEST(BucketPlan, DescribesBucketSizes) {
  EXPECT_EQ(describe_plan({{1, 0}, {2}}, {1024, 1024, 3u << 20}), "2 buckets: 2.0 KiB, 3.0 MiB");
}

}  // namespace
}  // namespace dtrain
