// The flight recorder's ring and labels, and the watchdog's naming of ranks that have not
// arrived (the pure parts; the MPI side is tested under mpirun and end to end).
#include "comm/flight_recorder.h"

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../data/temp_dir.h"
#include "comm/collective_watchdog.h"

namespace dtrain {
namespace {

// Issue 19, item 15: a rank killed in the middle of a dump left flight_recorder_rank1.json.tmp<PID>
// in the working tree for good. The next dump removes a dead writer's, never a live one's.
TEST(FlightRecorder, DumpRemovesADeadWritersTemporary) {
  dtrain::testing::TempDir tmp;
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  int status = 0;
  ::waitpid(dead, &status, 0);
  const std::string leftover = tmp.file(fmt::format("flight_recorder_rank1.json.tmp{}", dead));
  const std::string live = tmp.file(fmt::format("flight_recorder_rank1.json.tmp{}", ::getppid()));
  std::ofstream(leftover) << "{\"format\": \"dtrain-flight-recorder-1\", ";
  std::ofstream(live) << "{";
  FlightRecorder recorder(4);
  recorder.finished(recorder.enqueue("allreduce", DType::kF32, 10), true);
  std::string error;
  EXPECT_EQ(recorder.dump(tmp.path().string(), 1, 2, "test", {}, error), tmp.file("flight_recorder_rank1.json")) << error;
  EXPECT_FALSE(std::filesystem::exists(leftover));
  EXPECT_TRUE(std::filesystem::exists(live));
  EXPECT_TRUE(std::filesystem::exists(tmp.file("flight_recorder_rank1.json")));
}

TEST(FlightRecorder, KeepsTheLastNInOrderWithTheirStates) {
  FlightRecorder rec(3);
  for (int i = 0; i < 5; ++i) rec.enqueue("allreduce", DType::kF32, 10 + i);
  rec.started(4);
  rec.finished(4, true);
  rec.started(5);
  rec.started(1);  // no longer in the ring: ignored
  const std::vector<CollectiveRecord> r = rec.snapshot();
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].seq, 3);
  EXPECT_EQ(r[2].seq, 5);
  EXPECT_EQ(r[2].count, 14);
  EXPECT_EQ(r[0].state, CollectiveState::kEnqueued);
  EXPECT_EQ(r[1].state, CollectiveState::kCompleted);
  EXPECT_EQ(r[2].state, CollectiveState::kStarted);
  EXPECT_GT(r[1].completed_ns, 0);
  EXPECT_EQ(rec.last_seq(), 5);
}

TEST(FlightRecorder, LabelsJoinTheContextAndThisThreadsDetail) {
  set_collective_context("epoch 2 step 7");
  FlightRecorder rec;
  {
    ScopedCollectiveDetail detail("bucket 3");
    rec.enqueue("allreduce", DType::kF32, 1);
  }
  rec.enqueue("barrier", DType::kU8, 0);
  set_collective_context("");
  const auto r = rec.snapshot();
  EXPECT_EQ(r[0].label, "epoch 2 step 7 | bucket 3");
  EXPECT_EQ(r[1].label, "epoch 2 step 7");
  const nlohmann::json j = nlohmann::json::parse(rec.to_json(1, 2, "test", {0}));
  EXPECT_EQ(j["rank"], 1);
  EXPECT_EQ(j["records"][0]["label"], "epoch 2 step 7 | bucket 3");
  EXPECT_EQ(j["unresponsive_ranks"][0], 0);
}

ProgressBoard::Entry entry(int rank, int64_t started, int64_t completed, int64_t count, int64_t heartbeat) {
  ProgressBoard::Entry e;
  e.world_rank = rank;
  e.started = started;
  e.completed = completed;
  e.kind = ProgressBoard::kind_code("allreduce");
  e.count = count;
  e.dtype = static_cast<int>(DType::kF32);
  e.heartbeat_ns = heartbeat;
  return e;
}

TEST(ProgressBoard, NamesRanksBehindInAnotherCollectiveOrNotResponding) {
  const int ar = ProgressBoard::kind_code("allreduce"), f32 = static_cast<int>(DType::kF32);
  const int64_t now = 100'000'000'000;
  std::vector<ProgressBoard::Entry> board = {entry(0, 9, 8, 50, now), entry(1, 9, 8, 50, now), entry(2, 9, 8, 50, now)};
  EXPECT_EQ(not_arrived_text(board, 0, 9, ar, 50, f32, now), "");
  board[1] = entry(1, 8, 8, 50, now);
  EXPECT_EQ(not_arrived_text(board, 0, 9, ar, 50, f32, now), "rank 1 has not arrived (last started #8, completed #8)");
  board[1] = entry(1, 9, 8, 20, now);
  EXPECT_EQ(not_arrived_text(board, 0, 9, ar, 50, f32, now), "rank 1 is in a different collective #9: allreduce of 20 float32");
  board[2] = entry(2, 9, 8, 50, now - 5'000'000'000);
  EXPECT_EQ(unresponsive_ranks(board, 0, now), std::vector<int>{2});
  EXPECT_EQ(unresponsive_text(board, 0, now).rfind("rank 2 is not responding (stopped or frozen: no heartbeat for 5.0 s", 0), 0u);
  EXPECT_EQ(unresponsive_text(board, 2, now), "") << "its own heartbeat is not judged";
  EXPECT_NE(not_arrived_text(board, 0, 9, ar, 50, f32, now).find("rank 2 is not responding"), std::string::npos);
  EXPECT_EQ(not_arrived_text(board, 0, 9, ar, 50, f32, 0).find("rank 2"), std::string::npos) << "heartbeats not judged";
}

// Note [Stopped ranks beyond this communicator]: a rank is judged by its newest heartbeat on any
// board of the process, so one that left a communicator early (its beat there stopped) is not
// called stopped while it beats on another; one that beats on none is named, also when it is not
// in the waiting communicator (a stage's replica waits on a rank waiting on a stopped neighbour).
TEST(ProgressBoard, ATimeoutNamesARankStoppedOnEveryBoardAndOnlyThat) {
  const int ar = ProgressBoard::kind_code("allreduce"), f32 = static_cast<int>(DType::kF32);
  const int64_t now = 100'000'000'000, old = now - 5'000'000'000;
  // Rank 0 waits in stage #9 for rank 2, whose beat on this board stopped (it left it) but who
  // beats on the world's; rank 3, on the world's board only, beats nowhere.
  const std::vector<ProgressBoard::Entry> stage = {entry(0, 9, 8, 50, now), entry(2, 8, 8, 50, old)};
  const std::vector<ProgressBoard::Entry> world = {entry(0, 3, 3, 1, now), entry(1, 3, 3, 1, now),
                                                   entry(2, 3, 3, 1, now), entry(3, 3, 3, 1, old)};
  const std::vector<ProgressBoard::Entry> node = freshest_entries({stage, world});
  ASSERT_EQ(node.size(), 4u);
  const TimeoutExplanation why = explain_timeout(stage, 0, node, false, 9, ar, 50, f32, now);
  EXPECT_EQ(why.others.rfind("rank 2 has not arrived (last started #8, completed #8); beyond this communicator, "
                             "rank 3 is not responding (stopped or frozen: no heartbeat for 5.0 s)", 0), 0u)
      << why.others;
  EXPECT_EQ(why.suspects, std::vector<int>{3});
  // Judged by this board alone, rank 2 would be called stopped.
  EXPECT_NE(explain_timeout(stage, 0, {}, false, 9, ar, 50, f32, now).others.find("rank 2 is not responding"),
            std::string::npos);
  // A transfer's line names the stopped rank beyond it too.
  const TimeoutExplanation p2p = explain_timeout(stage, 0, node, true, 9, 0, 50, f32, now);
  EXPECT_NE(p2p.others.find("beyond this communicator, rank 3 is not responding"), std::string::npos) << p2p.others;
  EXPECT_EQ(p2p.others.find("rank 2 is not responding"), std::string::npos) << p2p.others;
}

}  // namespace
}  // namespace dtrain
