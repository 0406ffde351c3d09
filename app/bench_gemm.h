// `dtrain bench gemm [--size N] [--repeat R] [--threads T]`: the float32 GEMM rate of this binary
// on this machine (an N x N x N product through core/ops.h gemm(), the path every CPU layer
// multiplies with: the same BLAS library, kernels and threads as a training run), the best of R
// products, checked against the exact result. The ceiling bench/vs_peer.sh --model gpt sets a
// training run's model FLOP/s against.
#pragma once

#include <string>
#include <vector>

#include "comm/runtime.h"

namespace dtrain {

struct BenchGemmConfig {
  int64_t size = 1024;
  int repeat = 5;
  RuntimeOptions runtime;
};

struct ParsedBenchGemm {
  BenchGemmConfig config;
  bool help = false;
  std::string help_text;
};

// args excludes the program name and "bench gemm". Throws UsageError.
ParsedBenchGemm parse_bench_gemm_options(const std::vector<std::string>& args);

struct GemmRate {
  double flops_per_s = 0;  // 2 N^3 / the fastest product's wall time
  int64_t wrong = 0;       // result elements off the exact value
};

// Measures on this rank; rank 0 prints one line and a JSON line ({"sgemm_gflops": ...}).
GemmRate run_bench_gemm(Runtime& runtime, const BenchGemmConfig& config);

}  // namespace dtrain
