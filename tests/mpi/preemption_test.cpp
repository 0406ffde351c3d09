// Note [Agreeing to stop] at np 2 and 3: ranks that see a signal at different step boundaries
// (or not at all) all stop at the same boundary; the root's broadcast of a file or its error
// reaches every rank alike.
#include <csignal>

#include <gtest/gtest.h>

#include "app/preemption.h"
#include "app/root_broadcast.h"
#include "comm/exchange.h"
#include "tests/mpi/mpi_test_env.h"

namespace dtrain {
namespace {

// The boundary at which poll() first says stop, when this rank's signal arrives before
// boundary `signalled_at` (never when negative).
int stopping_boundary(Communicator& comm, int signalled_at, int signal) {
  StopVote vote(comm);
  for (int boundary = 0; boundary < 50; ++boundary) {
    const int local = signalled_at >= 0 && boundary >= signalled_at ? signal : 0;
    if (const int agreed = vote.poll(local)) {
      EXPECT_EQ(agreed, signal);
      return boundary;
    }
  }
  return -1;
}

TEST(StopVote, EveryRankStopsAtTheSameBoundary) {
  Communicator& comm = testing::test_comm();
  // Only the last rank is signalled, at boundary 7: all stop at boundary 8 (the vote cast at 7
  // is read at 8).
  const int last = comm.size() - 1;
  const int mine = stopping_boundary(comm, comm.rank() == last ? 7 : -1, SIGTERM);
  EXPECT_EQ(mine, 8);
  const std::vector<int> all = allgather_values(comm, mine);
  for (int r = 0; r < comm.size(); ++r) EXPECT_EQ(all[static_cast<size_t>(r)], mine) << "rank " << r;
}

TEST(StopVote, RanksSignalledAtDifferentBoundariesStopTogetherOnTheFirst) {
  Communicator& comm = testing::test_comm();
  const int mine = stopping_boundary(comm, 3 + 5 * comm.rank(), SIGINT);  // rank 0 first, at 3
  const std::vector<int> all = allgather_values(comm, mine);
  for (int r = 0; r < comm.size(); ++r) EXPECT_EQ(all[static_cast<size_t>(r)], 4) << "rank " << r;
}

TEST(StopVote, NoSignalNoStop) {
  EXPECT_EQ(stopping_boundary(testing::test_comm(), -1, SIGTERM), -1);
}

TEST(BroadcastFromRoot, EveryRankGetsTheRootsPartsOrItsError) {
  Communicator& comm = testing::test_comm();
  std::string big(3'000'001, 'x');
  big[12345] = '\0';  // bytes, not C strings
  auto parts = broadcast_from_root(comm, [&] { return std::vector<std::string>{"a", big, ""}; });
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0], "a");
  EXPECT_EQ(parts[1], big);
  EXPECT_EQ(parts[2], "");
  try {
    broadcast_from_root(comm, []() -> std::vector<std::string> { throw Error("dir/state.json: seed: missing"); });
    FAIL() << "no error";
  } catch (const AgreedError& e) {
    EXPECT_STREQ(e.what(), "dir/state.json: seed: missing");  // on every rank, not only the root
  }
}

}  // namespace
}  // namespace dtrain
