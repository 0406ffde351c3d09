// The NCCL watchdog's decision (comm/watchdog_policy.h): when it fails a run, which
// collective it blames, and the line it prints. Pure logic, so it runs in CPU-only builds.
#include "comm/watchdog_policy.h"

#include <vector>

#include <gtest/gtest.h>

namespace dtrain {
namespace {

using namespace std::chrono_literals;

const WatchdogClock::time_point t0{};  // an arbitrary origin; only differences matter

TEST(NcclWatchdogPolicy, NothingPendingAndNoErrorIsQuiet) {
  WatchdogVerdict v = watchdog_decide({}, t0 + 1h, 10min, "");
  EXPECT_EQ(v.action, WatchdogAction::kNone);
  EXPECT_EQ(watchdog_message(0, v), "");
}

TEST(NcclWatchdogPolicy, CollectivesWithinTheTimeoutAreLeftAlone) {
  std::vector<WatchdogPending> pending = {{7, "allreduce", t0}, {8, "allreduce", t0 + 5s}};
  EXPECT_EQ(watchdog_decide(pending, t0 + 10min, 10min, "").action, WatchdogAction::kNone);  // not *over* yet
}

TEST(NcclWatchdogPolicy, TheOldestOverdueCollectiveTimesOut) {
  // Listed out of order: the verdict must name the oldest, whatever the container order.
  std::vector<WatchdogPending> pending = {{9, "broadcast", t0 + 30s}, {8, "allreduce", t0 + 20s}};
  WatchdogVerdict v = watchdog_decide(pending, t0 + 20s + 600500ms, 10min, "");
  EXPECT_EQ(v.action, WatchdogAction::kTimeout);
  EXPECT_EQ(v.seq, 8);
  EXPECT_EQ(v.op, "allreduce");
  EXPECT_DOUBLE_EQ(v.waited_s, 600.5);
  EXPECT_EQ(watchdog_message(3, v),
            "dtrain: rank 3: NCCL allreduce #8 timed out after 600.5s (a peer may have died or issued different "
            "collectives)");
}

TEST(NcclWatchdogPolicy, AnAsyncErrorFailsAtOnceAndBlamesTheOldestCollective) {
  std::vector<WatchdogPending> pending = {{12, "allgather", t0 + 2s}, {11, "allreduce", t0 + 1s}};
  WatchdogVerdict v = watchdog_decide(pending, t0 + 3s, 10min, "remote process exited or there was a network error");
  EXPECT_EQ(v.action, WatchdogAction::kFail);
  EXPECT_EQ(v.seq, 11);
  EXPECT_EQ(watchdog_message(1, v),
            "dtrain: rank 1: NCCL allreduce #11 failed: remote process exited or there was a network error");
}

TEST(NcclWatchdogPolicy, AnAsyncErrorWithNothingPendingBlamesTheCommunicator) {
  WatchdogVerdict v = watchdog_decide({}, t0, 10min, "unhandled system error");
  EXPECT_EQ(v.action, WatchdogAction::kFail);
  EXPECT_EQ(watchdog_message(0, v), "dtrain: rank 0: NCCL communicator failed: unhandled system error");
}

// The failure text is thrown to the main thread, which prefixes it once: it has no prefix of
// its own (it used to print "dtrain: rank 0: dtrain: rank 0: NCCL ...").
TEST(NcclWatchdogPolicy, TheFailureTextCarriesNoRankPrefix) {
  WatchdogVerdict v = watchdog_decide({}, t0, 10min, "unhandled system error");
  EXPECT_EQ(watchdog_failure_text(v), "NCCL communicator failed: unhandled system error");
  EXPECT_EQ(watchdog_message(4, v), "dtrain: rank 4: " + watchdog_failure_text(v));
}

TEST(NcclWatchdogPolicy, SetUpPhasesAreNamedWithoutASequenceNumber) {
  std::vector<WatchdogPending> pending = {{0, "init", t0}};
  WatchdogVerdict v = watchdog_decide(pending, t0 + 61s, 60s, "");
  EXPECT_EQ(v.action, WatchdogAction::kTimeout);
  EXPECT_EQ(watchdog_message(2, v),
            "dtrain: rank 2: NCCL init timed out after 61.0s (a peer may have died or issued different collectives)");
}

}  // namespace
}  // namespace dtrain
