// dtrain flight-report: the first collective not completed everywhere, and who is behind.
#include "app/flight_report.h"

#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "../data/temp_dir.h"
#include "comm/collective_log.h"
#include "comm/flight_recorder.h"

namespace dtrain {
namespace {

using nlohmann::json;

json record(int64_t seq, const char* kind, int64_t count, const char* state) {
  return {{"seq", seq}, {"kind", kind}, {"dtype", "float32"}, {"count", count}, {"label", "epoch 1 step 3"},
          {"state", state}, {"started_ns", 1'000'000'000}, {"completed_ns", 0}};
}

std::string dump(int rank, int world, std::vector<json> records, std::vector<int> unresponsive = {}) {
  return json{{"rank", rank}, {"world_size", world}, {"host", fmt::format("n{}", rank)}, {"reason", "timeout"},
              {"dumped_ns", 6'000'000'000}, {"unresponsive_ranks", unresponsive}, {"records", records}}
      .dump();
}

TEST(FlightReport, NamesTheMissingRankAndWhatTheOthersWaitedIn) {
  const std::string report = flight_report(
      {dump(0, 3, {record(4, "allreduce", 10, "completed"), record(5, "allreduce", 20, "started")}),
       dump(1, 3, {record(4, "allreduce", 10, "completed"), record(5, "allreduce", 20, "started")})});
  EXPECT_NE(report.find("2 of 3 rank(s) wrote a dump; no dump from rank(s) 2"), std::string::npos) << report;
  EXPECT_NE(report.find("first collective not completed on every rank: #5 allreduce of 20 float32"), std::string::npos)
      << report;
  EXPECT_NE(report.find("rank 0 (n0): waiting in #5"), std::string::npos) << report;
  EXPECT_NE(report.find("behind or missing: rank(s) 2\n"), std::string::npos) << report;
}

TEST(FlightReport, ARankThatNeverIssuedTheCollectiveIsBehind) {
  const std::string report = flight_report(
      {dump(0, 2, {record(7, "allreduce", 10, "started")}), dump(1, 2, {record(6, "allreduce", 10, "completed")})});
  EXPECT_NE(report.find("rank 1 (n1): behind, never issued #7"), std::string::npos) << report;
  EXPECT_NE(report.find("behind or missing: rank(s) 1\n"), std::string::npos) << report;
}

TEST(FlightReport, RanksInDifferentCollectivesAreNamedFirst) {
  const std::string report = flight_report(
      {dump(0, 2, {record(3, "allreduce", 10, "started")}), dump(1, 2, {record(3, "broadcast", 10, "started")})});
  EXPECT_NE(report.find("ranks disagree at collective #3: rank 0 issued allreduce of 10 float32, rank 1 issued "
                        "broadcast of 10 float32"),
            std::string::npos)
      << report;
}

// ZeRO's collectives are reported like any other: a reduce-scatter's count is per rank.
TEST(FlightReport, ReduceScatterAndAllgatherAreReportedByKind) {
  const std::string waiting = flight_report(
      {dump(0, 2, {record(8, "reduce_scatter", 64, "completed"), record(9, "allgather", 64, "started")}),
       dump(1, 2, {record(8, "reduce_scatter", 64, "completed")})});
  EXPECT_NE(waiting.find("first collective not completed on every rank: #9 allgather of 64 float32"), std::string::npos)
      << waiting;
  EXPECT_NE(waiting.find("rank 1 (n1): behind, never issued #9"), std::string::npos) << waiting;
  const std::string disagree = flight_report(
      {dump(0, 2, {record(3, "reduce_scatter", 64, "started")}), dump(1, 2, {record(3, "allreduce", 128, "started")})});
  EXPECT_NE(disagree.find("ranks disagree at collective #3: rank 0 issued reduce_scatter of 64 float32, rank 1 issued "
                          "allreduce of 128 float32"),
            std::string::npos)
      << disagree;
}

TEST(FlightReport, ARankSeenNotRespondingIsBehind) {
  const std::string report = flight_report({dump(0, 2, {record(3, "allreduce", 10, "started")}, {1}),
                                            dump(1, 2, {record(3, "allreduce", 10, "started")})});
  EXPECT_NE(report.find("behind or missing: rank(s) 1\n"), std::string::npos) << report;
}

// Issue 20: NCCL's collectives were never recorded. The NCCL communicator (a plugin that does not
// link comm) records through comm/collective_log.h's LoggedCollective into a FlightRecorder of
// its own, "nccl": enqueued and started when issued, finished from the watchdog's thread when
// the event completes. Here that helper is driven as the NCCL communicator drives it, dumped
// beside an MPI recorder's dump, and flight-report gives each communicator its own section.
TEST(FlightReport, NcclCollectivesRecordedThroughTheSharedHelperAreReportedInTheirOwnSection) {
  dtrain::testing::TempDir tmp;
  FlightRecorder nccl(16, "nccl");
  FlightRecorder mpi(16);
  {
    ScopedCollectiveDetail detail("bucket 0");
    const LoggedCollective done(&nccl, "allreduce", DType::kF32, 1024);
    done.started();
    std::thread watchdog([done] { done.finished(true); });  // the completion callback's thread
    watchdog.join();
  }
  const LoggedCollective hung(&nccl, "allreduce", DType::kBF16, 512);
  hung.started();  // the event never completes: the watchdog times it out
  const LoggedCollective unrecorded(nullptr, "allreduce", DType::kF32, 8);  // no recorder: nothing
  unrecorded.started();
  unrecorded.finished(true);
  const LoggedCollective control(&mpi, "allreduce", DType::kF32, 2);
  control.started();
  control.finished(true);

  std::string error;
  const std::string dir = tmp.path().string();
  const std::string nccl_path = nccl.dump(dir, 0, 1, "NCCL allreduce #2 timed out", {}, error);
  ASSERT_EQ(nccl_path, FlightRecorder::dump_path(dir, 0, "nccl")) << error;
  EXPECT_EQ(std::filesystem::path(nccl_path).filename(), "flight_recorder_rank0_nccl.json");
  const std::string mpi_path = mpi.dump(dir, 0, 1, "NCCL allreduce #2 timed out", {}, error);
  ASSERT_EQ(std::filesystem::path(mpi_path).filename(), "flight_recorder_rank0.json") << error;

  std::vector<std::string> texts;
  for (const std::string& path : {mpi_path, nccl_path}) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    texts.push_back(text.str());
  }
  const json records = json::parse(texts[1]).at("records");
  ASSERT_EQ(records.size(), 2u) << texts[1];
  EXPECT_EQ(records[0].at("state"), "completed");
  EXPECT_EQ(records[0].at("label"), "bucket 0");
  EXPECT_GT(records[0].at("completed_ns").get<int64_t>(), 0);
  EXPECT_EQ(records[1].at("state"), "started");
  EXPECT_EQ(records[1].at("dtype"), "bfloat16");
  EXPECT_EQ(json::parse(texts[1]).at("communicator"), "nccl");

  const std::string report = flight_report(texts);
  EXPECT_EQ(report.find("mpi collectives:\n  1 of 1 rank(s) wrote a dump\n"), 0u) << report;
  EXPECT_NE(report.find("nccl collectives:\n  1 of 1 rank(s) wrote a dump\n"
                        "  first collective not completed on every rank: #2 allreduce of 512 bfloat16\n"
                        "    rank 0 ("),
            std::string::npos)
      << report;
}

// Note [Point-to-point]: a sender and its receiver are not "ranks that disagree"; each rank's
// oldest transfer not completed is named instead.
TEST(FlightReport, PointToPointSectionsNameEachRanksOldestOpenTransferAndNoDisagreement) {
  const std::string report = flight_report(
      {dump(0, 2, {record(3, "send", 10, "completed"), record(4, "send", 10, "started")}, {1}),
       dump(1, 2, {record(3, "recv", 10, "completed"), record(4, "recv", 8, "started")})});
  EXPECT_EQ(report.find("disagree"), std::string::npos) << report;
  EXPECT_NE(report.find("rank 0 (n0): waiting in #4 send of 10 float32"), std::string::npos) << report;
  EXPECT_NE(report.find("rank 1 (n1): waiting in #4 recv of 8 float32"), std::string::npos) << report;
  EXPECT_NE(report.find("behind or missing: rank(s) 1"), std::string::npos) << report;
}

}  // namespace
}  // namespace dtrain
