#include "app/trace.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "app/files.h"
#include "comm/exchange.h"

#include "core/error.h"

namespace dtrain {

void Tracer::add(std::string name, const char* category, int tid, int64_t start_ns, int64_t end_ns) {
  if (!enabled_) return;
  spans_.push_back({std::move(name), category, tid, start_ns, std::max(start_ns, end_ns)});
}

Tracer::Overlap Tracer::backward_overlap() const {
  // Backward spans do not overlap one another (one compute thread); sorted by start, each
  // all-reduce span only needs those from the first one ending after it starts.
  std::vector<std::pair<int64_t, int64_t>> backward;
  for (const TraceSpan& b : spans_)
    if (b.tid == 0 && b.name == "backward") backward.emplace_back(b.start_ns, b.end_ns);
  std::sort(backward.begin(), backward.end());
  Overlap o;
  for (const TraceSpan& a : spans_) {
    if (a.tid != 1) continue;
    o.allreduce_ns += static_cast<double>(a.end_ns - a.start_ns);
    auto it = std::lower_bound(backward.begin(), backward.end(), a.start_ns,
                               [](const std::pair<int64_t, int64_t>& b, int64_t t) { return b.second <= t; });
    for (; it != backward.end() && it->first < a.end_ns; ++it)
      o.overlapped_ns += static_cast<double>(std::min(a.end_ns, it->second) - std::max(a.start_ns, it->first));
  }
  return o;
}

void Tracer::add_backward(const BackwardTiming& t) {
  if (!enabled_) return;
  add("backward", "compute", 0, t.start_ns, t.end_ns);
  add("gradient sync wait", "compute", 0, t.end_ns, t.synced_ns);
  for (const BucketTiming& b : t.buckets)
    add(fmt::format("allreduce bucket {} ({} KiB)", b.bucket, b.bytes / 1024), "comm", 1, b.started_ns, b.finished_ns);
}

Tracer::Overlap Tracer::write(const std::string& path, Communicator& comm) const {
  // Each rank renders its own events; rank 0 concatenates them. Times are relative to the
  // rank's first span (steady clocks are per host, so absolute values would not line up).
  int64_t t0 = spans_.empty() ? 0 : spans_.front().start_ns;
  for (const TraceSpan& s : spans_) t0 = std::min(t0, s.start_ns);
  nlohmann::json events = nlohmann::json::array();
  for (const TraceSpan& s : spans_)
    events.push_back({{"name", s.name}, {"cat", s.category}, {"ph", "X"}, {"pid", comm.rank()}, {"tid", s.tid},
                      {"ts", static_cast<double>(s.start_ns - t0) / 1e3},
                      {"dur", static_cast<double>(s.end_ns - s.start_ns) / 1e3}});
  // The rank's origin on its host's steady clock: ranks of one host can be lined up exactly
  // (bench/pipeline_timeline.py does).
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", comm.rank()},
                    {"args", {{"name", fmt::format("rank {}", comm.rank())}, {"steady_t0_ns", t0}}}});
  const std::vector<std::string> all = allgather_strings(comm, events.dump());

  const Overlap local = backward_overlap();
  float sums_us[2] = {static_cast<float>(local.allreduce_ns / 1e3), static_cast<float>(local.overlapped_ns / 1e3)};
  comm.allreduce(sums_us, 2, DType::kF32, ReduceOp::kSum);

  if (comm.rank() == 0) {
    nlohmann::json trace = {{"displayTimeUnit", "ms"}, {"traceEvents", nlohmann::json::array()}};
    for (const std::string& rank_events : all)
      for (auto& e : nlohmann::json::parse(rank_events)) trace["traceEvents"].push_back(std::move(e));
    write_file_atomically(path, trace.dump() + "\n");
  }
  return {sums_us[0] * 1e3, sums_us[1] * 1e3};
}

}  // namespace dtrain
