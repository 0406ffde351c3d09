#include "app/bench_gemm.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "app/train_options.h"
#include "core/command_line.h"
#include "core/error.h"
#include "core/ops.h"

namespace dtrain {

ParsedBenchGemm parse_bench_gemm_options(const std::vector<std::string>& args) {
  cxxopts::Options o("dtrain bench gemm", "This binary's float32 GEMM rate (N x N x N, best of R), checked.");
  // clang-format off
  o.add_options()
    ("size", "N of the N x N x N product", cxxopts::value<int64_t>()->default_value("1024"))
    ("repeat", "Products timed; the fastest counts", cxxopts::value<int>()->default_value("5"))
    ("threads", "CPU BLAS threads per rank (0: cores / local ranks)", cxxopts::value<int>()->default_value("0"))
    ("h,help", "Show this help");
  // clang-format on
  const ParsedFlags flags = parse_flags(o, args);
  ParsedBenchGemm out;
  if (flags.help) {
    out.help = true;
    out.help_text = flags.help_text;
    return out;
  }
  const cxxopts::ParseResult& r = flags.result;
  out.config.runtime = parse_runtime_flags("cpu", r["threads"].as<int>());
  out.config.size = r["size"].as<int64_t>();
  if (out.config.size < 1 || out.config.size > 16384)
    throw UsageError(fmt::format("--size: must be in [1, 16384], got {}", out.config.size));
  out.config.repeat = r["repeat"].as<int>();
  if (out.config.repeat < 1) throw UsageError(fmt::format("--repeat: must be positive, got {}", out.config.repeat));
  return out;
}

GemmRate run_bench_gemm(Runtime& rt, const BenchGemmConfig& c) {
  const int64_t n = c.size;
  // 0.5 x 0.25 summed n times is exact in float32 for every n here: the check is exact.
  std::vector<float> a(static_cast<size_t>(n * n), 0.5f), b(a.size(), 0.25f), out(a.size());
  double best = 1e30;
  for (int i = 0; i <= c.repeat; ++i) {  // product 0 warms the library up (threads, buffers)
    std::fill(out.begin(), out.end(), -1.f);
    const auto t0 = std::chrono::steady_clock::now();
    gemm(Device::cpu(), false, false, n, n, n, 1.f, a.data(), b.data(), 0.f, out.data());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) best = std::min(best, s);
  }
  GemmRate rate;
  const float exact = 0.125f * static_cast<float>(n);
  rate.wrong = std::count_if(out.begin(), out.end(), [&](float v) { return v != exact; });
  rate.flops_per_s = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / best;
  if (rt.rank() == 0) {
    fmt::print("sgemm {}^3 through dtrain's gemm(): {:.1f} GFLOP/s (best of {}), {} wrong element(s)\n", n,
               rate.flops_per_s / 1e9, c.repeat, rate.wrong);
    const nlohmann::json record = {{"sgemm_gflops", rate.flops_per_s / 1e9}, {"size", n}, {"wrong", rate.wrong}};
    fmt::print("{}\n", record.dump());
  }
  std::fflush(stdout);
  return rate;
}

}  // namespace dtrain
