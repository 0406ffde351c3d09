// `dtrain bench allreduce`, the pure half: the sizes swept, the inputs whose sums are exact, the
// statistics (median, algorithm and bus bandwidth as nccl-tests defines them), the table, the
// fastest path at each size, and the JSON record. No MPI: tests call these directly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"

namespace dtrain {

// min_bytes, 2 min_bytes, ... up to max_bytes.
std::vector<int64_t> bench_sizes(int64_t min_bytes, int64_t max_bytes);

double median_of(std::vector<double> values);

// nccl-tests' bus bandwidth for all-reduce: algbw x 2(n-1)/n, the rate each link must carry.
double bus_bandwidth(double algbw, int ranks);

// Rank `rank`'s element i: an integer in [-2, 2], so sums over up to 64 ranks are exact in
// float32 and bfloat16 (|sum| <= 128 < 2^8).
float bench_input(int rank, int64_t i);
// The exact sum of bench_input over `ranks` ranks.
float bench_expected_sum(int ranks, int64_t i);

// `count` elements of `dtype` (kF32 or kBF16) as bytes: `value(i)` encoded.
template <class Value>
std::vector<uint8_t> encode_values(DType dtype, int64_t count, Value value);

// Elements of `got` that differ (bitwise) from `expected`; the first one's index in *first.
int64_t count_wrong(const void* got, const void* expected, int64_t count, DType dtype, int64_t* first);
float decode_value(const void* data, DType dtype, int64_t i);

struct BenchRow {
  std::string path;
  DType dtype = DType::kF32;
  int64_t bytes = 0, count = 0;
  double seconds = 0;  // median of the timed calls, the slowest rank's
  double algbw = 0, busbw = 0;  // GB/s (1e9 bytes per second)
  int64_t wrong = 0;   // wrong elements over every rank and every call
};

struct BenchSkip {
  std::string path, reason;
};

struct BenchHeader {
  int ranks = 0, nodes = 0, max_local_size = 0;
  std::string device;
  int iters = 0, warmup = 0;
};

// The table, the skipped paths with their reasons, and the fastest path by size.
std::string format_bench_report(const BenchHeader& header, const std::vector<BenchRow>& rows,
                                const std::vector<BenchSkip>& skipped);
// Per dtype: "flat 8 B - 2 KiB, hierarchical 4 KiB - 256 MiB" (ranges of sizes where a path is fastest).
std::vector<std::string> fastest_paths(const std::vector<BenchRow>& rows);
nlohmann::json bench_json(const BenchHeader& header, const std::vector<BenchRow>& rows,
                          const std::vector<BenchSkip>& skipped);
std::string format_bytes(int64_t bytes);  // 8 B, 4 KiB, 256 MiB

}  // namespace dtrain

#include "app/bench_report_inl.h"
