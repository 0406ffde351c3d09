// The progress line: when it is drawn (a terminal the user watches, decided from dtrain-launch's
// stdout under a launcher) and what it says.
#include "app/progress.h"

#include <gtest/gtest.h>

namespace dtrain {
namespace {

TEST(Progress, AutoFollowsTheTerminalTheUserWatches) {
  // Started alone: this process's own stdout.
  EXPECT_TRUE(progress_wanted(ProgressMode::kAuto, false, std::nullopt, true));
  EXPECT_FALSE(progress_wanted(ProgressMode::kAuto, false, std::nullopt, false));
  // Under a launcher the rank's stdout is a pseudo-terminal whatever the user sees: only the
  // launcher's answer counts, and plain mpirun (no answer) gets the plain lines.
  EXPECT_FALSE(progress_wanted(ProgressMode::kAuto, true, std::nullopt, true));
  EXPECT_FALSE(progress_wanted(ProgressMode::kAuto, true, std::string("0"), true));
  EXPECT_TRUE(progress_wanted(ProgressMode::kAuto, true, std::string("1"), false));
  // on and off are obeyed.
  EXPECT_TRUE(progress_wanted(ProgressMode::kOn, true, std::string("0"), false));
  EXPECT_FALSE(progress_wanted(ProgressMode::kOff, false, std::nullopt, true));
}

TEST(Progress, LineShowsEpochPercentRateLossAndEta) {
  ProgressState s{2, 3, 30000, 60000, 91200.4, 0.51234f, 125};
  const std::string line = render_progress(s, 120);
  EXPECT_EQ(line, "epoch 2/3  50% [###############...............] 30000/60000  91200 samples/s  loss 0.5123  ETA 2:05");
  EXPECT_LE(render_progress(s, 60).size(), 60u) << "the bar gives way on narrow terminals";
  s.eta_seconds = 3725;
  EXPECT_NE(render_progress(s, 120).find("ETA 1:02:05"), std::string::npos);
}

TEST(Progress, LanguageModelLineShowsStepPercentTokensLossLrAndEta) {
  LmProgressState s{120, 500, 4114.4, 2.34561f, 9.87e-4, 92};
  EXPECT_EQ(render_progress(s, 120),
            "step 120/500  24% [#######.......................]  4114 tokens/s  loss 2.3456  lr 9.87e-04  ETA 1:32");
  EXPECT_LE(render_progress(s, 60).size(), 60u) << "the bar gives way on narrow terminals";
  s.step = 500;
  EXPECT_NE(render_progress(s, 120).find("100% [##############################]"), std::string::npos);
}

}  // namespace
}  // namespace dtrain
