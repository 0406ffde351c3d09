// `dtrain`: the command-line trainer. `dtrain train [flags]` runs data-parallel training on as
// many ranks as it was started with (dtrain-launch, mpirun -np N, srun, or one process alone).
// Flags are parsed before anything starts, so --help and flag errors need no MPI job.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "app/bench_allreduce.h"
#include "app/train_options.h"
#include "app/trainer.h"
#include "comm/mpi_lifecycle.h"
#include "comm/runtime.h"
#include "core/cpu_blas.h"
#include "core/error.h"

namespace {

constexpr const char* kUsage =
    "usage: dtrain train [flags]              (dtrain train --help for the flags)\n"
    "       dtrain bench allreduce [flags]    (dtrain bench allreduce --help)\n"
    "  runs on every rank it is started with: dtrain-launch -n 2 -- dtrain train --epochs 1\n";

bool is_rank_zero_before_init() {
  const std::string rank = dtrain::launcher_rank();
  return rank.empty() || rank == "0";
}

int usage_error(const std::string& message) {
  if (is_rank_zero_before_init()) fmt::print(stderr, "dtrain: error: {}\n", message);
  return 2;
}

// OpenBLAS picks its kernels when it loads, before main(): to use a better one (see
// core/cpu_blas.h) the process re-executes itself once with OPENBLAS_CORETYPE set. This runs
// before MPI starts, so under mpirun the rank keeps its PID and environment.
void reexec_with_better_blas_kernels(char** argv) {
  const std::string coretype = dtrain::preferred_blas_coretype();
  if (coretype.empty()) return;
  setenv("OPENBLAS_CORETYPE", coretype.c_str(), 1);
  execv("/proc/self/exe", argv);  // returns only on failure: then carry on with the default kernels
}

// A failure after start-up: one line. With peers, every one of them is taken down too (none
// may wait in a collective for this rank); alone, the runtime shuts down normally.
int fail(const std::string& message, std::unique_ptr<dtrain::Runtime>& runtime, int exit_code) {
  std::fflush(stdout);
  const bool peers = runtime ? runtime->size() > 1 : !dtrain::launcher_rank().empty();
  if (peers) dtrain::abort_all(message, exit_code);
  fmt::print(stderr, "dtrain: error: {}\n", message);
  runtime.reset();
  return exit_code;
}

int run_train(const std::vector<std::string>& args, int* argc, char*** argv) {
  dtrain::ParsedTrain parsed;
  try {
    parsed = dtrain::parse_train_options(args);
  } catch (const dtrain::UsageError& e) {
    return usage_error(e.what());
  }
  if (parsed.help) {
    if (is_rank_zero_before_init()) fmt::print("{}", parsed.help_text);
    return 0;
  }
  std::unique_ptr<dtrain::Runtime> runtime;
  try {
    runtime = dtrain::init(argc, argv, parsed.config.runtime);
    dtrain::train(*runtime, parsed.config);
  } catch (const std::exception& e) {
    return fail(e.what(), runtime, 1);
  }
  runtime.reset();
  return 0;
}

int run_bench_allreduce_command(const std::vector<std::string>& args, int* argc, char*** argv) {
  dtrain::ParsedBenchAllreduce parsed;
  try {
    parsed = dtrain::parse_bench_allreduce_options(args);
  } catch (const dtrain::UsageError& e) {
    return usage_error(e.what());
  }
  if (parsed.help) {
    if (is_rank_zero_before_init()) fmt::print("{}", parsed.help_text);
    return 0;
  }
  std::unique_ptr<dtrain::Runtime> runtime;
  int64_t wrong = 0;
  try {
    runtime = dtrain::init(argc, argv, parsed.config.runtime);
    wrong = dtrain::run_bench_allreduce(*runtime, parsed.config);
  } catch (const std::exception& e) {
    return fail(e.what(), runtime, 1);
  }
  // Every rank knows the total, so all leave alike, without an abort.
  if (wrong > 0 && runtime->rank() == 0)
    fmt::print(stderr, "dtrain: error: bench allreduce: {} result element(s) differed from the exact sum\n", wrong);
  runtime.reset();
  return wrong > 0 ? 1 : 0;
}

int run_bench(const std::vector<std::string>& args, int* argc, char*** argv) {
  if (args.empty() || args[0] != "allreduce")
    return usage_error(fmt::format("bench: expected a benchmark name ('allreduce'), got '{}'",
                                   args.empty() ? "" : args[0]));
  return run_bench_allreduce_command({args.begin() + 1, args.end()}, argc, argv);
}

}  // namespace

int main(int argc, char** argv) {
  reexec_with_better_blas_kernels(argv);
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help") {
    fmt::print(args.empty() ? stderr : stdout, "{}", kUsage);
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "train") return run_train({args.begin() + 1, args.end()}, &argc, &argv);
  if (args[0] == "bench") return run_bench({args.begin() + 1, args.end()}, &argc, &argv);
  return usage_error(fmt::format("unknown command '{}'; expected 'train' or 'bench'", args[0]));
}
