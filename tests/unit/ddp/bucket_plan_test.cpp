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
