// Note [Agreeing to stop] at np 2 and 3: ranks that see a signal at different step boundaries
// (or not at all) all stop at the same boundary, whether they vote at every boundary or once a
// period; the root's broadcast of a file or its error reaches every rank alike.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <thread>

#include <gtest/gtest.h>

#include "app/preemption.h"
#include "comm/exchange.h"
#include "train/root_broadcast.h"
#include "tests/mpi/mpi_test_env.h"

namespace dtrain {
namespace {

// The boundary at which poll() first says stop, when this rank's signal arrives before
// boundary `signalled_at` (never when negative); each boundary takes `step_ms`.
int stopping_boundary(Communicator& comm, int signalled_at, int signal, double period_ms = 0, int step_ms = 0) {
  StopVote vote(comm, period_ms);
  for (int boundary = 0; boundary < 200; ++boundary) {
    if (step_ms) std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
    const int local = signalled_at >= 0 && boundary >= signalled_at ? signal : 0;
    if (const int agreed = vote.poll(local)) {
      EXPECT_EQ(agreed, signal);
      return boundary;
    }
  }
  return -1;
}

void expect_all_equal(Communicator& comm, int mine) {
  const std::vector<int> all = allgather_values(comm, mine);
  for (int r = 0; r < comm.size(); ++r) EXPECT_EQ(all[static_cast<size_t>(r)], mine) << "rank " << r;
}

TEST(StopVote, EveryRankStopsAtTheBoundaryWhereOneWasSignalled) {
  Communicator& comm = testing::test_comm();
  // Voting at every boundary; only the last rank is signalled, before boundary 7.
  const int mine = stopping_boundary(comm, comm.rank() == comm.size() - 1 ? 7 : -1, SIGTERM);
  EXPECT_EQ(mine, 7);
  expect_all_equal(comm, mine);
}

TEST(StopVote, RanksSignalledAtDifferentBoundariesStopTogetherOnTheFirst) {
  Communicator& comm = testing::test_comm();
  const int mine = stopping_boundary(comm, 3 + 5 * comm.rank(), SIGINT);  // rank 0 first, at 3
  EXPECT_EQ(mine, 3);
  expect_all_equal(comm, mine);
}

TEST(StopVote, VotingEveryPeriodStillStopsEveryRankAtOneBoundary) {
  Communicator& comm = testing::test_comm();
  // Steps of 1 ms and a vote every 8 ms: the ranks count rank 0's interval alike and stop at
  // the same boundary, within a period or so of the signal.
  const int mine = stopping_boundary(comm, comm.rank() == comm.size() - 1 ? 40 : -1, SIGTERM, 8, 1);
  EXPECT_GE(mine, 40);
  EXPECT_LE(mine, 40 + 40);
  expect_all_equal(comm, mine);
}

TEST(StopVote, NoSignalNoStop) {
  EXPECT_EQ(stopping_boundary(testing::test_comm(), -1, SIGTERM), -1);
}

// Note [Stopping on non-finite values]: the boundary at which the ranks agree that one saw a NaN
// (the last rank, from boundary `found_at` on), voting every `period_ms` of `step_ms` steps, and
// always at the boundaries in `forced`; the number of ranks that saw one, in `ranks`.
int nonfinite_boundary(Communicator& comm, int found_at, double period_ms, int step_ms, std::vector<int> forced,
                       int* ranks) {
  StopVote vote(comm, period_ms);
  const bool finder = comm.rank() == comm.size() - 1;
  for (int boundary = 0; boundary < 200; ++boundary) {
    if (step_ms) std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
    const bool force = std::find(forced.begin(), forced.end(), boundary) != forced.end();
    if (!vote.votes_here(force)) continue;
    const Verdict v = vote.cast({0, finder && boundary >= found_at});
    EXPECT_EQ(v.signal, 0);
    if (v.nonfinite_ranks > 0) {
      *ranks = v.nonfinite_ranks;
      return boundary;
    }
  }
  return -1;
}

TEST(StopVote, ANonFiniteValueOnOneRankStopsEveryRankAtOneBoundary) {
  Communicator& comm = testing::test_comm();
  int ranks = 0;
  const int mine = nonfinite_boundary(comm, 40, 8, 1, {}, &ranks);
  EXPECT_GE(mine, 40);
  EXPECT_LE(mine, 40 + 40);
  EXPECT_EQ(ranks, 1);
  expect_all_equal(comm, mine);
}

// A checkpoint boundary: every rank votes there, however long the period, so nothing found
// before it is saved.
TEST(StopVote, AForcedVoteComesAtTheSameBoundaryOnEveryRank) {
  Communicator& comm = testing::test_comm();
  int ranks = 0;
  // A period of 100 s: after the first boundary's vote the next would be thousands of boundaries on.
  const int mine = nonfinite_boundary(comm, 20, 100'000, 0, {10, 25, 30}, &ranks);
  EXPECT_EQ(mine, 25);
  EXPECT_EQ(ranks, 1);
  expect_all_equal(comm, mine);
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
    EXPECT_EQ(e.kind(), ErrorKind::kFailure);
  }
  // The error's kind travels with it, so that every rank exits with one status.
  try {
    broadcast_from_root(comm, []() -> std::vector<std::string> {
      throw Error("dir/step-5/model.safetensors: CRC-32 mismatch", ErrorKind::kCheckpoint);
    });
    FAIL() << "no error";
  } catch (const AgreedError& e) {
    EXPECT_STREQ(e.what(), "dir/step-5/model.safetensors: CRC-32 mismatch");
    EXPECT_EQ(e.kind(), ErrorKind::kCheckpoint);
  }
}

}  // namespace
}  // namespace dtrain
