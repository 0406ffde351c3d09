// `dtrain`: the command-line trainer. `dtrain train [flags]` runs data-parallel training on
// as many ranks as it was started with (dtrain-launch, mpirun -np N, srun, or one process).
// Flags are parsed before MPI starts, so --help and flag errors need no MPI job.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <unistd.h>

#include "comm/init.h"
#include "core/cpu_blas.h"
#include "core/error.h"
#include "examples/train_options.h"

namespace {

constexpr const char* kUsage =
    "usage: dtrain train [flags]    (dtrain train --help for the flags)\n"
    "  runs on every rank it is started with: dtrain-launch -n 2 -- dtrain train --epochs 1\n";

bool is_rank_zero_before_init() {
  const std::string rank = dtrain::launcher_rank();
  return rank.empty() || rank == "0";
}

int usage_error(const std::string& message) {
  if (is_rank_zero_before_init()) fmt::print(stderr, "dtrain: error: {}\n", message);
  return 2;
}

}  // namespace

// OpenBLAS picks its kernels when it loads, before main(): to use a better one (see
// core/cpu_blas.h) the process re-executes itself once with OPENBLAS_CORETYPE set. This runs
// before MPI starts, so under mpirun the rank keeps its PID and environment.
void reexec_with_better_blas_kernels(char** argv) {
  const std::string coretype = dtrain::preferred_blas_coretype();
  if (coretype.empty()) return;
  setenv("OPENBLAS_CORETYPE", coretype.c_str(), 1);
  execv("/proc/self/exe", argv);  // returns only on failure: then carry on with the default kernels
}

int main(int argc, char** argv) {
  reexec_with_better_blas_kernels(argv);
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help") {
    fmt::print(args.empty() ? stderr : stdout, "{}", kUsage);
    return args.empty() ? 2 : 0;
  }
  if (args[0] != "train") return usage_error(fmt::format("unknown command '{}'; expected 'train'", args[0]));
  args.erase(args.begin());

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

  dtrain::DistributedContext ctx;
  try {
    ctx = dtrain::init(&argc, &argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "dtrain: error: {}\n", e.what());
    return 1;
  }
  try {
    const dtrain::TrainConfig& c = parsed.config;
    dtrain::TrainResult r = dtrain::train(c, *ctx.comm);
    if (c.json && ctx.comm->rank() == 0)
      fmt::print(
          "{{\"dtrain\":\"{}\",\"np\":{},\"device\":\"{}\",\"model\":\"{}\",\"hidden\":\"{}\",\"batch_per_rank\":{},"
          "\"epochs\":{},\"comm_hook\":\"{}\",\"samples_per_s\":{:.1f},\"train_s\":{:.2f},\"test_acc\":{:.4f},"
          "\"allreduce_overlap\":{:.3f}}}\n",
          DTRAIN_VERSION, r.world_size, r.device, c.model.name, fmt::join(c.model.hidden, ","), c.batch_size,
          c.epochs, c.comm_hook, r.samples_per_second, r.train_seconds, r.test_accuracy, r.allreduce_overlap);
    std::fflush(stdout);
  } catch (const dtrain::UsageError& e) {
    // Raised after start-up (e.g. --device cuda on a machine without one): same on every rank.
    if (ctx.comm->rank() == 0) fmt::print(stderr, "dtrain: error: {}\n", e.what());
    dtrain::finalize(ctx);
    return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    if (ctx.comm->size() > 1) dtrain::abort_all(e.what(), 1);  // one line, then every peer is torn down
    fmt::print(stderr, "dtrain: error: {}\n", e.what());        // alone: no peer to bring down
    dtrain::finalize(ctx);
    return 1;
  }
  dtrain::finalize(ctx);
  return 0;
}
