// dtrain flight-report: the first collective not completed everywhere, and who is behind.
#include "app/flight_report.h"

#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

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

TEST(FlightReport, ARankSeenNotRespondingIsBehind) {
  const std::string report = flight_report({dump(0, 2, {record(3, "allreduce", 10, "started")}, {1}),
                                            dump(1, 2, {record(3, "allreduce", 10, "started")})});
  EXPECT_NE(report.find("behind or missing: rank(s) 1\n"), std::string::npos) << report;
}

}  // namespace
}  // namespace dtrain
