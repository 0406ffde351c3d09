// The pure choice of an all-reduce algorithm for a job's layout (what --allreduce auto does).
#include "comm/allreduce_algorithm.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace dtrain {
namespace {

AllreduceAlgorithm chosen(AllreduceAlgorithm requested, int world, int nodes, int max_local) {
  return choose_allreduce(requested, NodeLayout{world, nodes, max_local}).algorithm;
}

TEST(ChooseAllreduce, AutoIsHierarchicalOnlyAcrossNodesWithASharedNode) {
  using A = AllreduceAlgorithm;
  EXPECT_EQ(chosen(A::kAuto, 4, 2, 2), A::kHierarchical);
  EXPECT_EQ(chosen(A::kAuto, 3, 2, 2), A::kHierarchical);  // 2 + 1: one node still shares
  EXPECT_EQ(chosen(A::kAuto, 2, 2, 1), A::kFlat);          // one rank per node: nothing to share
  EXPECT_EQ(chosen(A::kAuto, 4, 1, 4), A::kShm);
  EXPECT_EQ(chosen(A::kAuto, 1, 1, 1), A::kFlat);
}

TEST(ChooseAllreduce, ExplicitChoicesAreKeptAndShmAcrossNodesIsAnError) {
  using A = AllreduceAlgorithm;
  EXPECT_EQ(chosen(A::kFlat, 4, 2, 2), A::kFlat);
  EXPECT_EQ(chosen(A::kHierarchical, 2, 1, 2), A::kHierarchical);
  EXPECT_EQ(chosen(A::kShm, 2, 1, 2), A::kShm);
  try {
    choose_allreduce(A::kShm, NodeLayout{4, 2, 2});
    FAIL() << "shm across nodes was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("one node"), std::string::npos) << e.what();
  }
}

TEST(ChooseAllreduce, NamesRoundTrip) {
  for (const char* name : {"auto", "flat", "shm", "hierarchical"}) {
    auto parsed = parse_allreduce_algorithm(name);
    ASSERT_TRUE(parsed) << name;
    EXPECT_STREQ(allreduce_algorithm_name(*parsed), name);
  }
  EXPECT_FALSE(parse_allreduce_algorithm("ring"));
}

}  // namespace
}  // namespace dtrain
