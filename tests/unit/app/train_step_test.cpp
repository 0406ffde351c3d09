// The fp16 test hook's step list (DTRAIN_TEST_POISON_GRADS, app/train_step.h): which steps a rank
// poisons, and a malformed list refused in one line.
#include <gtest/gtest.h>

#include "app/train_step.h"
#include "core/error.h"

namespace dtrain {
namespace {

TEST(GradPoison, StepsForEveryRankOrOneRank) {
  const GradPoison rank0("3,7@1,9@0", 0), rank1("3,7@1,9@0", 1);
  EXPECT_TRUE(rank0.hits(3));
  EXPECT_FALSE(rank0.hits(7));
  EXPECT_TRUE(rank0.hits(9));
  EXPECT_TRUE(rank1.hits(3));
  EXPECT_TRUE(rank1.hits(7));
  EXPECT_FALSE(rank1.hits(9));
  EXPECT_FALSE(GradPoison(nullptr, 0).hits(1)) << "unset: none";
  EXPECT_FALSE(GradPoison("", 0).hits(1));
}

TEST(GradPoison, AMalformedListIsOneLine) {
  for (const char* bad : {"x", "3,", "0", "3@", "3@a", "2x"}) {
    try {
      GradPoison p(bad, 0);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()), std::string("DTRAIN_TEST_POISON_GRADS: expected steps like 3,7@1, got '") + bad + "'");
    }
  }
}

}  // namespace
}  // namespace dtrain
