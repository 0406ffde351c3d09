#include "ddp/trace.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include <fmt/format.h>

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

Tracer::Overlap Tracer::write(const std::string& path, Communicator& comm) const {
  // Each rank renders its own events; rank 0 concatenates them. Times are relative to the
  // rank's first span (steady clocks are per host, so absolute values would not line up).
  int64_t t0 = spans_.empty() ? 0 : spans_.front().start_ns;
  for (const TraceSpan& s : spans_) t0 = std::min(t0, s.start_ns);
  std::string mine;
  for (const TraceSpan& s : spans_) {
    mine += fmt::format(R"({{"name":"{}","cat":"{}","ph":"X","pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f}}},)", s.name,
                        s.category, comm.rank(), s.tid, static_cast<double>(s.start_ns - t0) / 1e3,
                        static_cast<double>(s.end_ns - s.start_ns) / 1e3);
    mine += "\n";
  }
  mine += fmt::format(R"({{"name":"process_name","ph":"M","pid":{},"args":{{"name":"rank {}"}}}},)", comm.rank(),
                      comm.rank());
  mine += "\n";

  // Gather variable-length text as fixed-size int32 words: first the lengths, then padded bytes.
  const int size = comm.size();
  std::vector<int32_t> lengths(static_cast<size_t>(size));
  int32_t my_len = static_cast<int32_t>(mine.size());
  comm.allgather(&my_len, lengths.data(), 1, DType::kI32);
  const int32_t max_len = *std::max_element(lengths.begin(), lengths.end());
  const int64_t words = (max_len + 3) / 4;
  std::vector<int32_t> send(static_cast<size_t>(words), 0), recv(static_cast<size_t>(words * size));
  std::copy(mine.begin(), mine.end(), reinterpret_cast<char*>(send.data()));
  comm.allgather(send.data(), recv.data(), words, DType::kI32);

  Overlap local = backward_overlap();
  float sums[2] = {static_cast<float>(local.allreduce_ns / 1e3), static_cast<float>(local.overlapped_ns / 1e3)};
  comm.allreduce(sums, 2, DType::kF32, ReduceOp::kSum);

  if (comm.rank() == 0) {
    std::string body = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
    for (int r = 0; r < size; ++r)
      body.append(reinterpret_cast<const char*>(recv.data() + r * words), static_cast<size_t>(lengths[r]));
    body.pop_back();  // the last ",\n"
    body.back() = '\n';
    body += "]}\n";
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << body;
      if (!out.flush()) throw Error(fmt::format("--trace: cannot write {}", tmp));
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) throw Error(fmt::format("--trace: cannot rename {} to {}: {}", tmp, path, ec.message()));
  }
  return {sums[0] * 1e3, sums[1] * 1e3};
}

}  // namespace dtrain
