// Restarts: --resume auto replaces whatever the program resumed from, a growing back-off, the
// restart count honoured, and failures that retrying cannot fix not retried.
#include "launcher/restart_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <utility>

#include <fmt/format.h>

namespace dtrain::launcher {
namespace {

using namespace std::chrono_literals;
using ::testing::ElementsAre;

TEST(RestartPolicy, NeedsACheckpointDir) {
  EXPECT_TRUE(has_checkpoint_dir({"dtrain", "train", "--checkpoint-dir", "ck"}));
  EXPECT_TRUE(has_checkpoint_dir({"dtrain", "train", "--checkpoint-dir=ck"}));
  EXPECT_FALSE(has_checkpoint_dir({"dtrain", "train", "--checkpoint-every", "5"}));
  EXPECT_FALSE(has_checkpoint_dir({"--checkpoint-dir"}));  // the program's name, not an argument
  EXPECT_FALSE(has_checkpoint_dir({}));
}

TEST(RestartPolicy, ResumeAutoIsAppendedOnce) {
  EXPECT_THAT(with_resume_auto({"dtrain", "train", "--checkpoint-dir", "ck"}),
              ElementsAre("dtrain", "train", "--checkpoint-dir", "ck", "--resume", "auto"));
  EXPECT_THAT(with_resume_auto({"dtrain", "train", "--resume", "ck/step-40", "--epochs", "3"}),
              ElementsAre("dtrain", "train", "--epochs", "3", "--resume", "auto"));
  EXPECT_THAT(with_resume_auto({"dtrain", "train", "--resume=ck/step-40", "--resume", "auto"}),
              ElementsAre("dtrain", "train", "--resume", "auto"));
  EXPECT_THAT(with_resume_auto(with_resume_auto({"p", "--checkpoint-dir", "c"})),
              ElementsAre("p", "--checkpoint-dir", "c", "--resume", "auto"));
}

JobOutcome failed(int status, JobOutcome::Kind kind = JobOutcome::Kind::kRankFailed) {
  return {kind, status, "rank 1 on n1 was killed by signal 9 (SIGKILL)"};
}

TEST(RestartPolicy, RestartsWithAGrowingBackoffThenGivesUp) {
  const RestartDecision first = decide_restart(failed(137), 0, 2);
  EXPECT_TRUE(first.restart);
  EXPECT_EQ(first.backoff, 1s);
  EXPECT_EQ(first.line, "restart 1 of 2 in 1 s with --resume auto, after: rank 1 on n1 was killed by signal 9 (SIGKILL)");
  const RestartDecision second = decide_restart(failed(137), 1, 2);
  EXPECT_TRUE(second.restart);
  EXPECT_EQ(second.backoff, 2s);
  const RestartDecision last = decide_restart(failed(137), 2, 2);
  EXPECT_FALSE(last.restart);
  EXPECT_EQ(last.line, "rank 1 on n1 was killed by signal 9 (SIGKILL) (gave up after 2 restarts)");
  EXPECT_EQ(decide_restart(failed(137), 9, 100).backoff, 30s);
}

TEST(RestartPolicy, WithoutRestartsTheCauseAlone) {
  const RestartDecision d = decide_restart(failed(137), 0, 0);
  EXPECT_FALSE(d.restart);
  EXPECT_EQ(d.line, "rank 1 on n1 was killed by signal 9 (SIGKILL)");
}

TEST(RestartPolicy, HopelessFailuresAreNotRetried) {
  for (int status : {2, 126, 127}) {
    const RestartDecision d = decide_restart(failed(status), 0, 5);
    EXPECT_FALSE(d.restart) << status;
    EXPECT_THAT(d.line, ::testing::HasSubstr("(not restarted: ")) << status;
  }
  EXPECT_FALSE(decide_restart(failed(127, JobOutcome::Kind::kMpirunFailed), 0, 5).restart);
  const JobOutcome interrupted{JobOutcome::Kind::kInterrupted, 130, "interrupted: all 2 rank(s) stopped"};
  EXPECT_FALSE(decide_restart(interrupted, 0, 5).restart);
}

// dtrain train exits 3 when it stopped on a NaN or an infinity (app/divergence.h): resuming
// from the last finite checkpoint with the same settings would diverge the same way.
TEST(RestartPolicy, ADivergedRunIsNotRetried) {
  const JobOutcome diverged{JobOutcome::Kind::kRankFailed, 3, "rank 0 on n1 exited with status 3"};
  const RestartDecision d = decide_restart(diverged, 0, 5);
  EXPECT_FALSE(d.restart);
  EXPECT_THAT(d.line, ::testing::HasSubstr("(not restarted: exit status 3 is a diverged training run"));
}

// Each permanent status of dtrain's contract (core/exit_status.h) stops the restarts with one
// line saying what it is and why a restart would not help.
TEST(RestartPolicy, PermanentExitStatusesAreNotRetried) {
  const std::pair<int, const char*> cases[] = {
      {2, "exit status 2 is a usage error; a restart would fail the same way"},
      {3, "exit status 3 is a diverged training run (a NaN or an infinity); a restart would fail the same way"},
      {65, "exit status 65 is bad data; a restart would fail the same way"},
      {66, "exit status 66 is a corrupt or mismatched checkpoint or weights file; a restart would fail the same way"},
      {71, "exit status 71 is a model or data set that does not fit in memory; a restart would fail the same way"},
      {73, "exit status 73 is an output path that cannot be written; a restart would fail the same way"},
  };
  for (const auto& [status, why] : cases) {
    const JobOutcome o{JobOutcome::Kind::kRankFailed, status,
                       fmt::format("rank 0 on n1 exited with status {}", status)};
    const RestartDecision d = decide_restart(o, 0, 3);
    EXPECT_FALSE(d.restart) << status;
    EXPECT_EQ(d.line, fmt::format("rank 0 on n1 exited with status {} (not restarted: {})", status, why));
  }
}

// Failures a restart may fix: a peer that died or stopped, a timeout (1), a rank killed by a
// signal, and statuses dtrain does not give (another program's).
TEST(RestartPolicy, OtherExitStatusesAreRetried) {
  for (int status : {1, 4, 64, 70, 75, 137, 143}) EXPECT_TRUE(decide_restart(failed(status), 0, 3).restart) << status;
}

TEST(RestartPolicy, StartTimeoutsAndMpirunFailuresAreRetried) {
  EXPECT_TRUE(decide_restart(failed(124, JobOutcome::Kind::kStartTimeout), 0, 1).restart);
  EXPECT_TRUE(decide_restart(failed(1, JobOutcome::Kind::kMpirunFailed), 0, 1).restart);
}

}  // namespace
}  // namespace dtrain::launcher
