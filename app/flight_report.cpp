// The flight report: merge the ranks' dumps, find the first collective not completed everywhere.
#include "app/flight_report.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dtrain {

namespace {

using nlohmann::json;

struct Dump {
  int rank = 0;
  int world_size = 0;
  std::string host, reason;
  int64_t dumped_ns = 0;
  std::vector<int> unresponsive;  // ranks this one saw stopped or frozen
  std::map<int64_t, json> records;  // by sequence number
};

std::string describe(const json& r) {
  std::string label = r.value("label", "");
  return fmt::format("{} of {} {}{}", r.value("kind", "?"), r.value("count", int64_t{0}), r.value("dtype", "?"),
                     label.empty() ? "" : " (" + label + ")");
}

bool completed(const json& r) { return r.value("state", "") == "completed"; }

// The first sequence number this rank has not completed (one past its last record when all are).
int64_t first_incomplete(const Dump& d) {
  for (const auto& [seq, r] : d.records)
    if (!completed(r)) return seq;
  return d.records.empty() ? 1 : d.records.rbegin()->first + 1;
}

std::string rank_at(const Dump& d, int64_t seq) {
  const auto it = d.records.find(seq);
  if (it == d.records.end()) {
    if (d.records.empty() || d.records.rbegin()->first < seq)
      return fmt::format("rank {} ({}): behind, never issued #{}; its last collective is #{}", d.rank, d.host, seq,
                         d.records.empty() ? 0 : d.records.rbegin()->first);
    return fmt::format("rank {} ({}): #{} is no longer in its ring", d.rank, d.host, seq);
  }
  const json& r = it->second;
  const std::string state = r.value("state", "");
  if (state == "started")
    return fmt::format("rank {} ({}): waiting in #{} {} for {:.1f} s", d.rank, d.host, seq, describe(r),
                       static_cast<double>(d.dumped_ns - r.value("started_ns", int64_t{0})) * 1e-9);
  if (state == "enqueued")
    return fmt::format("rank {} ({}): #{} issued but not started (an earlier collective is still running)", d.rank,
                       d.host, seq);
  return fmt::format("rank {} ({}): #{} {}", d.rank, d.host, seq, state);
}

// The first sequence number at which two ranks recorded different collectives.
std::optional<std::string> first_disagreement(const std::vector<Dump>& dumps) {
  std::map<int64_t, std::vector<std::pair<int, std::string>>> by_seq;
  for (const Dump& d : dumps)
    for (const auto& [seq, r] : d.records)
      by_seq[seq].emplace_back(d.rank, fmt::format("{} of {} {}", r.value("kind", "?"), r.value("count", int64_t{0}),
                                                   r.value("dtype", "?")));
  for (const auto& [seq, seen] : by_seq) {
    for (const auto& [rank, what] : seen) {
      if (what == seen.front().second) continue;
      return fmt::format("ranks disagree at collective #{}: rank {} issued {}, rank {} issued {}", seq,
                         seen.front().first, seen.front().second, rank, what);
    }
  }
  return std::nullopt;
}

}  // namespace

namespace {

// The report lines for the dumps of one communicator.
std::vector<std::string> report_lines(std::vector<Dump> dumps);

}  // namespace

std::string flight_report(const std::vector<std::string>& texts) {
  // Each communicator (MPI, NCCL) numbers its collectives on its own: one section each.
  std::map<std::string, std::vector<Dump>> by_communicator;
  for (const std::string& text : texts) {
    const json j = json::parse(text);
    Dump d;
    d.rank = j.at("rank").get<int>();
    d.world_size = j.at("world_size").get<int>();
    d.host = j.value("host", "?");
    d.reason = j.value("reason", "");
    d.dumped_ns = j.value("dumped_ns", int64_t{0});
    if (j.contains("unresponsive_ranks")) d.unresponsive = j.at("unresponsive_ranks").get<std::vector<int>>();
    for (const json& r : j.at("records")) d.records[r.at("seq").get<int64_t>()] = r;
    by_communicator[j.value("communicator", "mpi")].push_back(std::move(d));
  }
  const bool only_mpi = by_communicator.size() == 1 && by_communicator.begin()->first == "mpi";
  std::string out;
  for (auto& [communicator, dumps] : by_communicator) {
    if (!only_mpi) out += fmt::format("{} collectives:\n", communicator);
    for (const std::string& line : report_lines(std::move(dumps))) out += (only_mpi ? "" : "  ") + line + "\n";
  }
  return out;
}

namespace {

bool point_to_point(const json& r) {
  const std::string kind = r.value("kind", "");
  return kind == "send" || kind == "recv" || kind == "sendrecv";
}

// Note [Point-to-point] (comm/communicator.h): a communicator of sends and receives numbers them
// per rank (a stage sends what its neighbour receives), so ranks are not compared by number:
// each rank's oldest transfer not completed, with the peers its label names.
std::vector<std::string> point_to_point_lines(std::vector<Dump> dumps) {
  std::sort(dumps.begin(), dumps.end(), [](const Dump& a, const Dump& b) { return a.rank < b.rank; });
  std::vector<std::string> lines = {fmt::format(
      "{} rank(s) wrote a dump; point-to-point transfers (numbered per rank; each names its peers)", dumps.size())};
  std::vector<int> behind;
  for (const Dump& d : dumps) {
    const int64_t first = first_incomplete(d);
    if (d.records.count(first)) lines.push_back("  " + rank_at(d, first));
    else lines.push_back(fmt::format("  rank {} ({}): every recorded transfer completed", d.rank, d.host));
    for (int r : d.unresponsive) {
      lines.push_back(fmt::format("  rank {} saw rank {} stop responding (no heartbeat) while it waited", d.rank, r));
      behind.push_back(r);
    }
  }
  std::sort(behind.begin(), behind.end());
  behind.erase(std::unique(behind.begin(), behind.end()), behind.end());
  if (!behind.empty()) lines.push_back(fmt::format("behind or missing: rank(s) {}", fmt::join(behind, ",")));
  return lines;
}

std::vector<std::string> report_lines(std::vector<Dump> dumps) {
  for (const Dump& d : dumps)
    if (!d.records.empty() && point_to_point(d.records.rbegin()->second)) return point_to_point_lines(std::move(dumps));
  int world = 0;
  for (const Dump& d : dumps) world = std::max(world, d.world_size);
  std::sort(dumps.begin(), dumps.end(), [](const Dump& a, const Dump& b) { return a.rank < b.rank; });
  std::vector<std::string> lines;
  std::vector<int> missing;
  for (int r = 0; r < world; ++r)
    if (std::none_of(dumps.begin(), dumps.end(), [r](const Dump& d) { return d.rank == r; })) missing.push_back(r);
  lines.push_back(fmt::format("{} of {} rank(s) wrote a dump{}", dumps.size(), world,
                              missing.empty() ? "" : fmt::format("; no dump from rank(s) {}", fmt::join(missing, ","))));
  if (auto differ = first_disagreement(dumps)) lines.push_back(*differ);
  int64_t first = INT64_MAX;
  const Dump* witness = nullptr;
  for (const Dump& d : dumps) {
    const int64_t f = first_incomplete(d);
    if (f < first) first = f, witness = &d;
  }
  if (witness && witness->records.count(first))
    lines.push_back(fmt::format("first collective not completed on every rank: #{} {}", first,
                                describe(witness->records.at(first))));
  else if (witness)
    lines.push_back(fmt::format("first collective not completed on every rank: #{}", first));
  std::vector<int> behind = missing;
  for (const Dump& d : dumps) {
    lines.push_back("  " + rank_at(d, first));
    if (!d.records.empty() && d.records.rbegin()->first < first) behind.push_back(d.rank);
    for (int r : d.unresponsive) {
      lines.push_back(fmt::format("  rank {} saw rank {} stop responding (no heartbeat) while it waited", d.rank, r));
      behind.push_back(r);
    }
  }
  for (int r : missing)
    lines.push_back(fmt::format("  rank {}: no dump: it stopped, died or hung outside a collective before #{}", r, first));
  std::sort(behind.begin(), behind.end());
  behind.erase(std::unique(behind.begin(), behind.end()), behind.end());
  if (!behind.empty()) lines.push_back(fmt::format("behind or missing: rank(s) {}", fmt::join(behind, ",")));
  return lines;
}

}  // namespace

int run_flight_report(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) throw UsageError(fmt::format("flight-report: {} is not a directory", dir));
  std::vector<std::string> texts;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("flight_recorder_rank", 0) != 0 || entry.path().extension() != ".json") continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    texts.push_back(text.str());
  }
  if (texts.empty()) {
    std::fprintf(stderr, "dtrain: error: flight-report: no flight_recorder_rank*.json in %s\n", dir.c_str());
    return 1;
  }
  try {
    std::fputs(flight_report(texts).c_str(), stdout);
  } catch (const nlohmann::json::exception& e) {
    std::fprintf(stderr, "dtrain: error: flight-report: a dump in %s is not valid: %s\n", dir.c_str(), e.what());
    return 1;
  }
  return 0;
}

}  // namespace dtrain
