// dtrain-launch's decisions while a job runs, on a fake clock: the first failure is the one
// cause reported (the dead rank, not the peers that reacted), mpirun is left to end the job and
// killed only if it does not, the start-up bound names the ranks that did not report, an
// interrupt goes to the ranks first (they save and stop), mpirun is signalled only if they do not
// stop, a second interrupt kills at once, and the monitor finishes only when the supervisors are
// gone.
#include "launcher/job_monitor.h"

#include <signal.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace dtrain::launcher {
namespace {

using namespace std::chrono_literals;
using Action = JobMonitor::Action;
using How = RankExit::How;
using ::testing::HasSubstr;

const Clock::time_point t0{};

MonitorTimings timings(Clock::duration start_timeout = 0s) {
  MonitorTimings t;
  t.start_timeout = start_timeout;
  t.mpirun_grace = 3s;
  t.kill_grace = 2s;
  t.stop_grace = 3s;
  t.drain = 1500ms;
  return t;
}

// A monitor whose np ranks have all said hello from node<r>.
JobMonitor started(int np, MonitorTimings t = timings()) {
  JobMonitor m(np, t, t0);
  for (int r = 0; r < np; ++r) m.hello(r, "node" + std::to_string(r), t0);
  return m;
}

RankExit exit_of(int rank, How how, int code, bool stopped = false, std::string last = "") {
  return {rank, "", how, code, stopped, std::move(last)};
}

void all_gone(JobMonitor& m, int np, Clock::time_point now) {
  for (int r = 0; r < np; ++r) m.supervisor_closed(r, now);
}

TEST(JobMonitor, SuccessWhenEveryRankAndMpirunSucceed) {
  JobMonitor m = started(2);
  m.rank_exit(exit_of(0, How::kExited, 0), t0 + 1s);
  m.rank_exit(exit_of(1, How::kExited, 0), t0 + 1s);
  m.mpirun_exited(0, t0 + 1s);
  EXPECT_EQ(m.poll(t0 + 1s), Action::kWait);  // the supervisors are still there
  all_gone(m, 2, t0 + 1s);
  EXPECT_EQ(m.poll(t0 + 1s), Action::kFinish);
  EXPECT_EQ(m.outcome().kind, JobOutcome::Kind::kSucceeded);
  EXPECT_EQ(m.outcome().exit_status, 0);
}

TEST(JobMonitor, DeadRankIsNamedWithItsHost) {
  JobMonitor m = started(2);
  m.rank_exit(exit_of(1, How::kSignaled, SIGKILL), t0 + 5s);
  m.rank_exit(exit_of(0, How::kSignaled, SIGTERM, /*stopped=*/true), t0 + 5100ms);
  m.mpirun_exited(137, t0 + 6s);
  all_gone(m, 2, t0 + 6s);
  EXPECT_EQ(m.poll(t0 + 6s), Action::kFinish);
  const JobOutcome o = m.outcome();
  EXPECT_EQ(o.kind, JobOutcome::Kind::kRankFailed);
  EXPECT_EQ(o.cause, "rank 1 on node1 was killed by signal 9 (SIGKILL)");
  EXPECT_EQ(o.exit_status, 137);
}

TEST(JobMonitor, ThePeerThatNoticedIsNotBlamed) {
  JobMonitor m = started(3);
  m.rank_exit(exit_of(0, How::kExited, 1, false, "dtrain: rank 0: peer 2 is gone"), t0 + 5s);
  m.rank_exit(exit_of(2, How::kSignaled, SIGKILL), t0 + 5010ms);
  m.mpirun_exited(1, t0 + 6s);
  EXPECT_EQ(m.outcome().cause, "rank 2 on node2 was killed by signal 9 (SIGKILL)");
}

TEST(JobMonitor, AfterARankFailureMpirunEndsTheJobOrIsKilled) {
  JobMonitor m = started(2);
  m.rank_exit(exit_of(1, How::kExited, 3), t0 + 10s);
  // mpirun is ending the job itself: no SIGTERM (it would only disturb its abort).
  EXPECT_EQ(m.poll(t0 + 10s), Action::kWait);
  EXPECT_EQ(m.next_deadline(), t0 + 13s);
  EXPECT_EQ(m.poll(t0 + 12999ms), Action::kWait);
  EXPECT_EQ(m.poll(t0 + 13s), Action::kKill);
  EXPECT_EQ(m.poll(t0 + 14s), Action::kWait);  // once
  // Ranks ending after dtrain-launch killed mpirun are consequences.
  m.rank_exit(exit_of(0, How::kSignaled, SIGKILL), t0 + 13100ms);
  m.mpirun_exited(137, t0 + 13100ms);
  EXPECT_EQ(m.outcome().cause, "rank 1 on node1 exited with status 3");
  EXPECT_EQ(m.outcome().exit_status, 3);
}

TEST(JobMonitor, ASupervisorGoneWithoutAReportIsALostRank) {
  JobMonitor m = started(2);
  m.supervisor_closed(1, t0 + 2s);
  m.mpirun_exited(1, t0 + 3s);
  EXPECT_THAT(m.outcome().cause, ::testing::StartsWith("rank 1 on node1 ended without an exit status"));
  EXPECT_EQ(m.outcome().kind, JobOutcome::Kind::kRankFailed);
}

TEST(JobMonitor, StartTimeoutNamesTheRanksThatDidNotReport) {
  JobMonitor m(4, timings(300s), t0);
  m.hello(0, "nodeA", t0);
  m.hello(1, "nodeA", t0);
  m.hello(2, "nodeB", t0);
  m.reached_training(0, t0 + 10s);
  m.reached_training(2, t0 + 10s);
  EXPECT_EQ(m.next_deadline(), t0 + 300s);
  EXPECT_EQ(m.poll(t0 + 299s), Action::kWait);
  EXPECT_EQ(m.poll(t0 + 300s), Action::kTerminate);
  EXPECT_EQ(m.poll(t0 + 301s), Action::kWait);
  EXPECT_EQ(m.poll(t0 + 302s), Action::kKill);
  // The ranks then end (stopped); the line still tells what start-up looked like.
  for (int r = 0; r < 3; ++r) m.rank_exit(exit_of(r, How::kSignaled, SIGTERM, true), t0 + 301s);
  m.mpirun_exited(143, t0 + 302s);
  const JobOutcome o = m.outcome();
  EXPECT_EQ(o.kind, JobOutcome::Kind::kStartTimeout);
  EXPECT_EQ(o.exit_status, 124);
  EXPECT_THAT(o.cause, ::testing::StartsWith("start-up took longer than 300 s (--start-timeout): rank 1 on nodeA did "
                                             "not reach training; rank 3 never started ("));
}

TEST(JobMonitor, NoStartTimeoutOnceEveryRankReportedOrWithoutABound) {
  JobMonitor reached(2, timings(5s), t0);
  reached.reached_training(0, t0 + 1s);
  reached.rank_exit(exit_of(1, How::kExited, 0), t0 + 2s);  // finished: not still starting
  EXPECT_EQ(reached.poll(t0 + 100s), Action::kWait);
  EXPECT_EQ(reached.next_deadline(), Clock::time_point::max());
  JobMonitor unbounded(2, timings(0s), t0);
  EXPECT_EQ(unbounded.poll(t0 + 100000s), Action::kWait);
}

TEST(JobMonitor, InterruptGoesToTheRanksWhichStopOnTheirOwn) {
  JobMonitor m = started(2);
  m.interrupted(SIGTERM, t0 + 7s);
  EXPECT_EQ(m.poll(t0 + 7s), Action::kStopRanks);
  EXPECT_EQ(m.stop_signal(), SIGTERM);
  EXPECT_EQ(m.poll(t0 + 7s), Action::kWait);  // mpirun is left alone while the ranks save
  EXPECT_EQ(m.next_deadline(), t0 + 10s);
  m.rank_exit(exit_of(0, How::kExited, 143, true), t0 + 7500ms);
  m.rank_exit(exit_of(1, How::kExited, 143, true), t0 + 7500ms);
  m.mpirun_exited(143, t0 + 7600ms);
  all_gone(m, 2, t0 + 7600ms);
  EXPECT_EQ(m.poll(t0 + 7600ms), Action::kFinish);
  EXPECT_EQ(m.outcome().kind, JobOutcome::Kind::kInterrupted);
  EXPECT_EQ(m.outcome().exit_status, 143);
  EXPECT_EQ(m.outcome().cause, "interrupted by SIGTERM: all 2 rank(s) stopped");
}

TEST(JobMonitor, RanksThatDoNotStopAreKilledAfterTheStopGrace) {
  JobMonitor m = started(2);
  m.interrupted(SIGINT, t0 + 7s);
  EXPECT_EQ(m.poll(t0 + 7s), Action::kStopRanks);
  EXPECT_EQ(m.stop_signal(), SIGINT);
  EXPECT_EQ(m.poll(t0 + 9999ms), Action::kWait);
  EXPECT_EQ(m.poll(t0 + 10s), Action::kKill);
  m.mpirun_exited(137, t0 + 10s);
  EXPECT_EQ(m.outcome().exit_status, 130);
  EXPECT_EQ(m.outcome().cause, "interrupted by SIGINT: passed to all 2 rank(s); 2 had not stopped 3 s later: killed");
}

TEST(JobMonitor, RanksThatStoppedAreNotBlamedForAnMpirunThatLingers) {
  JobMonitor m = started(2);
  m.interrupted(SIGINT, t0 + 7s);
  EXPECT_EQ(m.poll(t0 + 7s), Action::kStopRanks);
  m.rank_exit(exit_of(0, How::kSignaled, SIGINT, true), t0 + 7100ms);
  m.rank_exit(exit_of(1, How::kSignaled, SIGINT, true), t0 + 7100ms);
  EXPECT_EQ(m.poll(t0 + 10s), Action::kKill);  // mpirun still tearing down across nodes
  m.mpirun_exited(137, t0 + 10s);
  EXPECT_EQ(m.outcome().cause, "interrupted by SIGINT: all 2 rank(s) stopped");
}

// --stop-timeout is the ranks' time to save; once all have stopped, a lingering mpirun gets
// kill_grace, not the rest of it.
TEST(JobMonitor, ALingeringMpirunIsKilledSoonAfterEveryRankStopped) {
  MonitorTimings t = timings();
  t.stop_grace = 60s;
  JobMonitor m = started(2, t);
  m.interrupted(SIGINT, t0 + 7s);
  EXPECT_EQ(m.poll(t0 + 7s), Action::kStopRanks);
  m.rank_exit(exit_of(0, How::kSignaled, SIGINT, true), t0 + 8s);
  EXPECT_EQ(m.poll(t0 + 8s), Action::kWait);
  EXPECT_EQ(m.next_deadline(), t0 + 67s);  // one rank still saving: the whole --stop-timeout
  m.rank_exit(exit_of(1, How::kSignaled, SIGINT, true), t0 + 9s);
  EXPECT_EQ(m.poll(t0 + 9s), Action::kWait);
  EXPECT_EQ(m.next_deadline(), t0 + 11s);
  EXPECT_EQ(m.poll(t0 + 11s), Action::kKill);
  m.mpirun_exited(137, t0 + 11s);
  EXPECT_EQ(m.outcome().cause, "interrupted by SIGINT: all 2 rank(s) stopped");
}

TEST(JobMonitor, ASecondInterruptKillsAtOnce) {
  JobMonitor m = started(2);
  m.interrupted(SIGINT, t0 + 7s);
  EXPECT_EQ(m.poll(t0 + 7s), Action::kStopRanks);
  m.interrupted(SIGINT, t0 + 8s);
  EXPECT_EQ(m.poll(t0 + 8s), Action::kKill);
  m.rank_exit(exit_of(0, How::kSignaled, SIGKILL), t0 + 8s);
  m.mpirun_exited(130, t0 + 8s);
  EXPECT_EQ(m.outcome().kind, JobOutcome::Kind::kInterrupted);
  EXPECT_EQ(m.outcome().exit_status, 130);
  EXPECT_EQ(m.outcome().cause,
            "interrupted by SIGINT: passed to all 2 rank(s); a second signal killed the 2 still running");
}

TEST(JobMonitor, HangupAndQuitStopTheRanksWithSigterm) {
  for (int signal : {SIGHUP, SIGQUIT}) {
    JobMonitor m = started(1);
    m.interrupted(signal, t0);
    EXPECT_EQ(m.poll(t0), Action::kStopRanks);
    EXPECT_EQ(m.stop_signal(), SIGTERM);
    m.mpirun_exited(143, t0 + 1s);
    EXPECT_EQ(m.outcome().exit_status, 128 + signal);
  }
}

TEST(JobMonitor, AfterMpirunEndsWaitForTheSupervisorsButNotForever) {
  JobMonitor m = started(2);
  m.interrupted(SIGINT, t0 + 1s);
  m.poll(t0 + 1s);
  m.mpirun_exited(143, t0 + 2s);
  m.supervisor_closed(0, t0 + 2s);
  EXPECT_EQ(m.poll(t0 + 2s), Action::kWait);
  EXPECT_EQ(m.next_deadline(), t0 + 3500ms);
  EXPECT_EQ(m.poll(t0 + 3500ms), Action::kFinish);
}

TEST(JobMonitor, MpirunFailingWithoutReportsSaysWhichRanksNeverStarted) {
  JobMonitor m(4, timings(), t0);
  m.hello(0, "a", t0);
  m.hello(1, "a", t0);
  m.rank_exit(exit_of(0, How::kExited, 0), t0 + 1s);
  m.rank_exit(exit_of(1, How::kExited, 0), t0 + 1s);
  m.mpirun_exited(1, t0 + 1s);
  const JobOutcome o = m.outcome();
  EXPECT_EQ(o.kind, JobOutcome::Kind::kMpirunFailed);
  EXPECT_EQ(o.exit_status, 1);
  EXPECT_THAT(o.cause, HasSubstr("mpirun exited with status 1 before ranks 2-3 started"));
}

TEST(JobMonitor, ReportsForRanksOutsideTheJobAreIgnored) {
  JobMonitor m = started(2);
  m.hello(5, "x", t0);
  m.rank_exit(exit_of(-1, How::kSignaled, 9), t0);
  m.supervisor_closed(9, t0);
  m.rank_exit(exit_of(0, How::kExited, 0), t0 + 1s);
  m.rank_exit(exit_of(1, How::kExited, 0), t0 + 1s);
  m.mpirun_exited(0, t0 + 1s);
  all_gone(m, 2, t0 + 1s);
  EXPECT_EQ(m.outcome().kind, JobOutcome::Kind::kSucceeded);
}

TEST(StartTimeoutLine, GroupsRanksByHost) {
  const std::string line = describe_start_timeout(
      2.5, {{"a", true}, {"b", false}, {"b", false}, {"a", false}, {std::nullopt, false}, {std::nullopt, false}});
  EXPECT_THAT(line, ::testing::StartsWith("start-up took longer than 2.5 s (--start-timeout): rank 3 on a, ranks 1-2 on b "
                                          "did not reach training; ranks 4-5 never started ("));
}

}  // namespace
}  // namespace dtrain::launcher
