// The pure parts of the per-collective checks (comm/collective_check.h): the header all-reduce's
// verdict, and the lines that name how ranks' collectives differ, from headers and from the board.
#include "comm/collective_check.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "comm/collective_watchdog.h"

namespace dtrain {
namespace {

const int kAllreduce = ProgressBoard::kind_code("allreduce");
const int kBroadcast = ProgressBoard::kind_code("broadcast");
const int kF32 = static_cast<int>(DType::kF32);

// The element-wise MAX an MPI_Allreduce would compute over every rank's packed header.
bool agree(const std::vector<CollectiveHeader>& all) {
  int64_t reduced[8];
  pack_header_check(all[0], reduced);
  for (const CollectiveHeader& h : all) {
    int64_t mine[8];
    pack_header_check(h, mine);
    for (int i = 0; i < 8; ++i) reduced[i] = std::max(reduced[i], mine[i]);
  }
  return header_check_agrees(reduced);
}

TEST(CollectiveCheck, TheHeaderAllreduceAgreesOnlyWhenEveryFieldIsEqual) {
  const CollectiveHeader a{12, kAllreduce, 100, kF32};
  EXPECT_TRUE(agree({a, a, a}));
  for (CollectiveHeader b : {CollectiveHeader{13, kAllreduce, 100, kF32}, CollectiveHeader{12, kBroadcast, 100, kF32},
                             CollectiveHeader{12, kAllreduce, 99, kF32},
                             CollectiveHeader{12, kAllreduce, 100, static_cast<int>(DType::kI32)}})
    EXPECT_FALSE(agree({a, a, b})) << "seq " << b.seq << " kind " << b.kind << " count " << b.count;
}

TEST(CollectiveCheck, TheMismatchLineGroupsRanksByWhatTheyIssued) {
  const CollectiveHeader a{12, kAllreduce, 100, kF32}, b{12, kAllreduce, 120, kF32};
  EXPECT_EQ(header_mismatch_text({a, a}), "");
  EXPECT_EQ(header_mismatch_text({a, b, b}),
            "ranks issued different collectives at #12: rank 0: allreduce of 100 float32; ranks 1,2: allreduce of 120 "
            "float32");
  const CollectiveHeader c{13, kBroadcast, 100, kF32};
  EXPECT_EQ(header_mismatch_text({a, c}),
            "ranks issued different collectives at #12: rank 0: #12 allreduce of 100 float32; rank 1: #13 broadcast of "
            "100 float32");
}

// Every kind a communicator records has its own code, and the code names it back.
TEST(CollectiveCheck, EveryKindHasACodeThatNamesIt) {
  std::vector<int> codes;
  for (const char* kind : {"allreduce", "broadcast", "allgather", "barrier", "reduce_scatter"}) {
    const int code = ProgressBoard::kind_code(kind);
    EXPECT_GT(code, 0) << kind;
    EXPECT_STREQ(ProgressBoard::kind_name(code), kind);
    EXPECT_EQ(std::count(codes.begin(), codes.end(), code), 0) << kind;
    codes.push_back(code);
  }
  EXPECT_EQ(ProgressBoard::kind_code("alltoall"), 0);
  const CollectiveHeader rs{5, ProgressBoard::kind_code("reduce_scatter"), 64, kF32};
  const CollectiveHeader ar{5, kAllreduce, 128, kF32};
  EXPECT_EQ(header_mismatch_text({rs, ar}),
            "ranks issued different collectives at #5: rank 0: reduce_scatter of 64 float32; rank 1: allreduce of 128 "
            "float32");
}

ProgressBoard::Entry at(int rank, int64_t seq, int kind, int64_t count) {
  ProgressBoard::Entry e;
  e.world_rank = rank;
  e.started = seq;
  e.kind = kind;
  e.count = count;
  e.dtype = kF32;
  return e;
}

TEST(CollectiveCheck, TheBoardNamesRanksInTheSameCollectiveWithAnotherKindOrSize) {
  std::vector<ProgressBoard::Entry> board = {at(0, 7, kAllreduce, 10), at(1, 7, kAllreduce, 10), at(2, 6, kBroadcast, 3)};
  EXPECT_EQ(different_collective_text(board, 0), "") << "a rank behind may yet arrive: not a mismatch";
  board[1] = at(1, 7, kBroadcast, 10);
  EXPECT_EQ(different_collective_text(board, 0),
            "ranks issued different collectives at #7: rank 0: allreduce of 10 float32; rank 1: broadcast of 10 float32");
  EXPECT_EQ(different_collective_text(board, 1), different_collective_text(board, 0)) << "every rank says the same";
  EXPECT_EQ(different_collective_text(board, 2), "") << "rank 2 is alone in #6";
}

}  // namespace
}  // namespace dtrain
