// Restarts: --resume auto replaces whatever the program resumed from, a growing back-off, the
// restart count honoured, and failures that retrying cannot fix not retried.
#include "launcher/restart_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

TEST(RestartPolicy, StartTimeoutsAndMpirunFailuresAreRetried) {
  EXPECT_TRUE(decide_restart(failed(124, JobOutcome::Kind::kStartTimeout), 0, 1).restart);
  EXPECT_TRUE(decide_restart(failed(1, JobOutcome::Kind::kMpirunFailed), 0, 1).restart);
}

}  // namespace
}  // namespace dtrain::launcher
