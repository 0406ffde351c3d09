// The dead-rank line and its parts: what it says for each way a rank ends, which of several
// failures is blamed, rank lists, and the last stderr line kept from a stream of bytes.
#include "launcher/rank_exit.h"

#include <signal.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace dtrain::launcher {
namespace {

using How = RankExit::How;

RankExit rank_exit(int rank, How how, int code, bool stopped = false, std::string last = "") {
  return {rank, "node" + std::to_string(rank), how, code, stopped, std::move(last)};
}

TEST(RankExit, KilledRankLineNamesRankHostAndSignal) {
  EXPECT_EQ(describe_rank_exit(rank_exit(1, How::kSignaled, SIGKILL)), "rank 1 on node1 was killed by signal 9 (SIGKILL)");
  EXPECT_EQ(describe_rank_exit(rank_exit(3, How::kSignaled, SIGSEGV, false, "step 12")),
            "rank 3 on node3 was killed by signal 11 (SIGSEGV); its last line on stderr: step 12");
}

TEST(RankExit, FailedRankLineNamesStatusAndLastStderrLine) {
  EXPECT_EQ(describe_rank_exit(rank_exit(2, How::kExited, 3, false, "dtrain: rank 2: cannot open x")),
            "rank 2 on node2 exited with status 3; its last line on stderr: dtrain: rank 2: cannot open x");
  EXPECT_EQ(describe_rank_exit(rank_exit(2, How::kExited, 1)), "rank 2 on node2 exited with status 1");
}

TEST(RankExit, LostAndStoppedRanksSaySo) {
  EXPECT_THAT(describe_rank_exit(rank_exit(0, How::kLost, 0)),
              ::testing::StartsWith("rank 0 on node0 ended without an exit status"));
  EXPECT_EQ(describe_rank_exit(rank_exit(0, How::kSignaled, SIGTERM, true)),
            "rank 0 on node0 was killed by signal 15 (SIGTERM) after the job was told to stop");
  RankExit unknown = rank_exit(4, How::kExited, 1);
  unknown.host.clear();
  EXPECT_EQ(describe_rank_exit(unknown), "rank 4 on an unknown host exited with status 1");
}

TEST(RankExit, StatusAsAShellReportsIt) {
  EXPECT_EQ(exit_status(rank_exit(0, How::kExited, 3)), 3);
  EXPECT_EQ(exit_status(rank_exit(0, How::kSignaled, SIGKILL)), 137);
  EXPECT_EQ(exit_status(rank_exit(0, How::kLost, 0)), 1);
  EXPECT_FALSE(is_failure(rank_exit(0, How::kExited, 0)));
  EXPECT_TRUE(is_failure(rank_exit(0, How::kExited, 1)));
  EXPECT_TRUE(is_failure(rank_exit(0, How::kSignaled, SIGTERM)));
  EXPECT_TRUE(is_failure(rank_exit(0, How::kLost, 0)));
}

TEST(RankExit, SignalNames) {
  EXPECT_EQ(signal_name(SIGKILL), "SIGKILL");
  EXPECT_EQ(signal_name(SIGINT), "SIGINT");
  EXPECT_EQ(signal_name(1000), "signal 1000");
}

TEST(ChooseCause, TheDeadRankIsBlamedNotThePeerThatNoticed) {
  // Rank 0 exits with an error about its peer before rank 1's death is reported.
  EXPECT_EQ(choose_cause({rank_exit(0, How::kExited, 1), rank_exit(1, How::kSignaled, SIGKILL)}), 1u);
}

TEST(ChooseCause, RanksStoppedByTheJobEndingAreConsequences) {
  EXPECT_EQ(choose_cause({rank_exit(0, How::kSignaled, SIGTERM, true), rank_exit(1, How::kExited, 3)}), 1u);
  EXPECT_EQ(choose_cause({rank_exit(0, How::kLost, 0, true), rank_exit(1, How::kExited, 3)}), 1u);
}

TEST(ChooseCause, FirstArrivalWinsAmongEquals) {
  EXPECT_EQ(choose_cause({rank_exit(2, How::kExited, 1), rank_exit(0, How::kExited, 1)}), 0u);
  EXPECT_EQ(choose_cause({rank_exit(2, How::kSignaled, 9), rank_exit(0, How::kSignaled, 9)}), 0u);
  EXPECT_EQ(choose_cause({rank_exit(0, How::kSignaled, 15, true)}), 0u);
}

TEST(FormatRanks, RunsAndSingles) {
  EXPECT_EQ(format_ranks({}), "");
  EXPECT_EQ(format_ranks({5}), "5");
  EXPECT_EQ(format_ranks({3, 0, 1, 2, 6, 6}), "0-3, 6");
  EXPECT_EQ(format_ranks({1, 3, 4}), "1, 3-4");
}

std::string last_line_of(std::initializer_list<std::string_view> chunks) {
  LastLine last;
  for (std::string_view c : chunks) last.feed(c);
  return last.line();
}

TEST(LastLine, KeepsTheLastNonEmptyLineAcrossChunks) {
  EXPECT_EQ(last_line_of({}), "");
  EXPECT_EQ(last_line_of({"first\nsec", "ond\n\n   \n"}), "second");
  EXPECT_EQ(last_line_of({"a\nunfinished"}), "unfinished");  // a dying rank's last words need no '\n'
  EXPECT_EQ(last_line_of({"windows\r", "\n"}), "windows");
  EXPECT_EQ(last_line_of({"progress 10%\rprogress 20%\n"}), "progress 20%");
  EXPECT_EQ(last_line_of({"\tcol1\tcol2 \n"}), "col1 col2");
}

TEST(LastLine, LongLinesAreCut) {
  const std::string line = last_line_of({std::string(10000, 'x') + "\n"});
  EXPECT_EQ(line, std::string(LastLine::kMaxLineBytes, 'x') + "...");
}

}  // namespace
}  // namespace dtrain::launcher
