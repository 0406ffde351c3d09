// The pure half of `dtrain bench allreduce`: sizes, inputs, statistics, table and JSON.
#include "app/bench_report.h"

#include <algorithm>
#include <cstring>
#include <map>

#include <fmt/format.h>

namespace dtrain {

std::vector<int64_t> bench_sizes(int64_t min_bytes, int64_t max_bytes) {
  std::vector<int64_t> sizes;
  for (int64_t b = min_bytes; b > 0 && b <= max_bytes; b *= 2) sizes.push_back(b);
  return sizes;
}

double median_of(std::vector<double> values) {
  if (values.empty()) return 0;
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid), values.end());
  if (values.size() % 2 == 1) return values[mid];
  const double upper = values[mid];
  return (*std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid)) + upper) / 2;
}

double bus_bandwidth(double algbw, int ranks) { return ranks > 0 ? algbw * 2.0 * (ranks - 1) / ranks : 0.0; }

float bench_input(int rank, int64_t i) { return static_cast<float>((i + 3 * static_cast<int64_t>(rank)) % 5 - 2); }

float bench_expected_sum(int ranks, int64_t i) {
  float sum = 0;
  for (int r = 0; r < ranks; ++r) sum += bench_input(r, i);
  return sum;
}

float decode_value(const void* data, DType dtype, int64_t i) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (dtype == DType::kBF16) {
    uint16_t h;
    std::memcpy(&h, p + i * 2, 2);
    return kernels::bf16_to_float(h);
  }
  float v;
  std::memcpy(&v, p + i * 4, 4);
  return v;
}

int64_t count_wrong(const void* got, const void* expected, int64_t count, DType dtype, int64_t* first) {
  const size_t esize = dtype_size(dtype);
  if (std::memcmp(got, expected, static_cast<size_t>(count) * esize) == 0) return 0;  // the usual case, fast
  int64_t wrong = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (std::memcmp(static_cast<const uint8_t*>(got) + i * esize, static_cast<const uint8_t*>(expected) + i * esize,
                    esize) == 0)
      continue;
    if (wrong++ == 0 && first) *first = i;
  }
  return wrong;
}

std::string format_bytes(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30) && bytes % (int64_t{1} << 30) == 0) return fmt::format("{} GiB", bytes >> 30);
  if (bytes >= (int64_t{1} << 20) && bytes % (int64_t{1} << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= 1024 && bytes % 1024 == 0) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} B", bytes);
}

std::vector<std::string> fastest_paths(const std::vector<BenchRow>& rows) {
  // dtype -> size -> the fastest row's path, then runs of equal winners become ranges.
  std::map<std::string, std::map<int64_t, const BenchRow*>> best;
  for (const BenchRow& r : rows) {
    const BenchRow*& b = best[dtype_name(r.dtype)][r.bytes];
    if (!b || r.seconds < b->seconds) b = &r;
  }
  std::vector<std::string> lines;
  for (const auto& [dtype, by_size] : best) {
    std::string line = fmt::format("{}:", dtype);
    auto it = by_size.begin();
    while (it != by_size.end()) {
      auto end = it;
      int64_t last = it->first;
      while (end != by_size.end() && end->second->path == it->second->path) last = (end++)->first;
      line += fmt::format(" {} {}{}{};", it->second->path, format_bytes(it->first), last != it->first ? " - " : "",
                          last != it->first ? format_bytes(last) : "");
      it = end;
    }
    line.pop_back();
    lines.push_back(line);
  }
  return lines;
}

std::string format_bench_report(const BenchHeader& h, const std::vector<BenchRow>& rows,
                                 const std::vector<BenchSkip>& skipped) {
  std::string out = fmt::format(
      "# dtrain bench allreduce: {} ranks on {} node(s) (at most {} per node), {}; in-place sum; median of {} calls "
      "after {} warm-up, slowest rank; every result checked against the exact sum\n",
      h.ranks, h.nodes, h.max_local_size, h.device, h.iters, h.warmup);
  out += fmt::format("# {:<13} {:<9} {:>12} {:>11} {:>12} {:>11} {:>11} {:>7}\n", "path", "dtype", "size(B)", "count",
                     "time(us)", "algbw(GB/s)", "busbw(GB/s)", "wrong");
  for (const BenchRow& r : rows)
    out += fmt::format("  {:<13} {:<9} {:>12} {:>11} {:>12.2f} {:>11.3f} {:>11.3f} {:>7}\n", r.path, dtype_name(r.dtype),
                       r.bytes, r.count, r.seconds * 1e6, r.algbw, r.busbw, r.wrong);
  for (const BenchSkip& s : skipped) out += fmt::format("# skipped {}: {}\n", s.path, s.reason);
  for (const BenchRow& r : rows)
    if (r.path == "shm" && r.dtype != DType::kF32 && r.bytes == rows.back().bytes) {
      out += "# note: the shared-memory path reduces float32 only; its other dtypes go through MPI_Allreduce\n";
      break;
    }
  for (const std::string& line : fastest_paths(rows)) out += fmt::format("# fastest, {}\n", line);
  return out;
}

nlohmann::json bench_json(const BenchHeader& h, const std::vector<BenchRow>& rows,
                          const std::vector<BenchSkip>& skipped) {
  nlohmann::json j = {{"benchmark", "allreduce"}, {"ranks", h.ranks},   {"nodes", h.nodes},
                      {"max_local_size", h.max_local_size}, {"device", h.device}, {"iters", h.iters},
                      {"warmup", h.warmup}, {"op", "sum"}, {"in_place", true}};
  int64_t wrong = 0;
  j["rows"] = nlohmann::json::array();
  for (const BenchRow& r : rows) {
    wrong += r.wrong;
    j["rows"].push_back({{"path", r.path}, {"dtype", dtype_name(r.dtype)}, {"bytes", r.bytes}, {"count", r.count},
                         {"time_us", r.seconds * 1e6}, {"algbw_gbps", r.algbw}, {"busbw_gbps", r.busbw},
                         {"wrong", r.wrong}});
  }
  j["skipped"] = nlohmann::json::array();
  for (const BenchSkip& s : skipped) j["skipped"].push_back({{"path", s.path}, {"reason", s.reason}});
  j["fastest"] = fastest_paths(rows);
  j["wrong_elements"] = wrong;
  return j;
}

}  // namespace dtrain
