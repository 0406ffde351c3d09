// `dtrain bench allreduce`: nccl-tests' all-reduce benchmark over dtrain's paths (flat MPI,
// shared memory, hierarchical, NCCL), with every result checked against the exact sum. Flags
// are parsed into a BenchAllreduceConfig once (UsageError names the flag); the run needs a job
// of at least two ranks (dtrain-launch, mpirun).
#pragma once

#include <string>
#include <vector>

#include "comm/runtime.h"
#include "core/tensor.h"

namespace dtrain {

enum class BenchPath { kFlat, kShm, kHierarchical, kNccl };
const char* bench_path_name(BenchPath path);

struct BenchAllreduceConfig {
  int64_t min_bytes = 8;
  int64_t max_bytes = int64_t{256} << 20;
  int iters = 20;
  int warmup = 5;
  std::vector<BenchPath> paths;    // empty: every available path
  std::vector<DType> dtypes = {DType::kF32, DType::kBF16};
  std::string json_path;
  int corrupt_rank = -1;  // test hook: this rank spoils one element of every result before the check
  RuntimeOptions runtime;
};

struct ParsedBenchAllreduce {
  BenchAllreduceConfig config;
  bool help = false;
  std::string help_text;
};

// args excludes the program name and "bench allreduce". Throws UsageError.
ParsedBenchAllreduce parse_bench_allreduce_options(const std::vector<std::string>& args);

// Runs the sweep, prints the table on rank 0 and writes the JSON file. Returns the number of
// wrong result elements over every rank (0 when every result was the exact sum). Throws
// dtrain::Error when it cannot run (one rank; a file it cannot write).
int64_t run_bench_allreduce(Runtime& runtime, const BenchAllreduceConfig& config);

}  // namespace dtrain
