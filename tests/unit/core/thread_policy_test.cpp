// The CPU thread policy's pure decisions: threads per rank, and how a GEMM is cut across a
// rank's threads (Note [One pool, sleeping waits] in core/ops.cpp).
#include <gtest/gtest.h>

#include "core/thread_policy.h"

namespace dtrain {
namespace {

TEST(ThreadsPerRank, CoresSharedEvenlyAtLeastOneEach) {
  EXPECT_EQ(threads_per_rank(2, 1), 2);
  EXPECT_EQ(threads_per_rank(2, 2), 1);
  EXPECT_EQ(threads_per_rank(2, 3), 1);
  EXPECT_EQ(threads_per_rank(16, 4), 4);
}

TEST(BlasThreadsForRank, RequestWinsElseCoresNoMoreThanBound) {
  EXPECT_EQ(blas_threads_for_rank(3, {2, 2}, 1), 3);
  EXPECT_EQ(blas_threads_for_rank(0, {2, 2}, 1), 2);  // one process alone: all cores
  EXPECT_EQ(blas_threads_for_rank(0, {2, 1}, 2), 1);  // np 2 on 2 cores, each bound to one
  EXPECT_EQ(blas_threads_for_rank(0, {16, 1}, 2), 1);  // plain mpirun's --bind-to core
}

// The blocks cover [0, extent) in order, without gaps or overlap, aligned but for the last.
void expect_tiles(const GemmSplit& s) {
  int64_t next = 0;
  for (int i = 0; i < s.parts; ++i) {
    const auto [begin, end] = s.range(i);
    EXPECT_EQ(begin, next) << i;
    EXPECT_GT(end, begin) << i;
    if (i + 1 < s.parts) {
      EXPECT_EQ((end - begin) % kGemmSplitAlign, 0) << i;
    }
    next = end;
  }
  EXPECT_EQ(next, s.extent);
}

TEST(GemmSplit, OneThreadNeverSplits) {
  const GemmSplit s = plan_gemm_split(2048, 2048, 2048, 1);
  EXPECT_EQ(s.parts, 1);
  expect_tiles(s);
}

TEST(GemmSplit, BigLayersSplitSmallOnesDoNot) {
  // 64 x 2048 x 784 (hidden 2048's first layer, forward) and its weight gradient 2048 x 784 x 64.
  GemmSplit s = plan_gemm_split(64, 2048, 784, 2);
  EXPECT_EQ(s.parts, 2);
  EXPECT_FALSE(s.rows);  // C's longer side: its 2048 columns
  expect_tiles(s);
  s = plan_gemm_split(2048, 784, 64, 2);
  EXPECT_EQ(s.parts, 2);
  EXPECT_TRUE(s.rows);
  expect_tiles(s);
  // Hidden 256's 64 x 256 x 784 (25.7 MFLOP) and the output layer's 64 x 10 x 256 stay whole.
  EXPECT_EQ(plan_gemm_split(64, 256, 784, 2).parts, 1);
  EXPECT_EQ(plan_gemm_split(256, 784, 64, 2).parts, 1);
  EXPECT_EQ(plan_gemm_split(64, 10, 256, 2).parts, 1);
}

TEST(GemmSplit, EveryPartGetsEnoughWork) {
  for (int64_t m : {1, 15, 16, 33, 64, 100, 784, 2048})
    for (int64_t n : {1, 10, 17, 256, 2048})
      for (int64_t k : {1, 25, 64, 784})
        for (int threads : {1, 2, 3, 8}) {
          const GemmSplit s = plan_gemm_split(m, n, k, threads);
          ASSERT_GE(s.parts, 1);
          ASSERT_LE(s.parts, threads);
          EXPECT_EQ(s.extent, s.rows ? m : n);
          EXPECT_EQ(s.rows, m >= n);
          if (s.parts > 1) {
            EXPECT_GE(2.0 * m * n * k / s.parts, kGemmMinFlopsPerThread) << m << "x" << n << "x" << k;
            EXPECT_GE(s.block, kGemmSplitAlign);
          }
          expect_tiles(s);
        }
}

TEST(GemmSplit, RoundingToTheAlignmentMayLeaveFewerParts) {
  // 40 rows over 3 threads: at most 40 / 16 = 2 parts, blocks of 32 -> rows 0-31 and 32-39.
  const GemmSplit s = plan_gemm_split(40, 8, 100000, 3);
  EXPECT_TRUE(s.rows);
  EXPECT_EQ(s.parts, 2);
  EXPECT_EQ(s.block, 32);
  EXPECT_EQ(s.range(1), (std::pair<int64_t, int64_t>{32, 40}));
  expect_tiles(s);
}

}  // namespace
}  // namespace dtrain
