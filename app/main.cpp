// `dtrain`: the command-line trainer. `dtrain train [flags]` runs data-parallel training on as
// many ranks as it was started with (dtrain-launch, mpirun -np N, srun, or one process alone);
// `dtrain eval --weights FILE` evaluates trained weights; `dtrain data shard` writes token shards;
// `dtrain checkpoint consolidate` writes a sharded checkpoint's optimizer state as one file. Flags are parsed before anything
// starts, so --help and flag errors need no MPI job. `dtrain sample` continues a prompt with a
// byte-level GPT.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "app/bench_allreduce.h"
#include "app/bench_gemm.h"
#include "app/checkpoint_command.h"
#include "app/data_command.h"
#include "app/divergence.h"
#include "app/eval_command.h"
#include "app/flight_report.h"
#include "app/sample_command.h"
#include "app/train_options.h"
#include "app/trainer.h"
#include "comm/mpi_lifecycle.h"
#include "comm/runtime.h"
#include "core/cpu_blas.h"
#include "core/error.h"
#include "core/exit_status.h"
#include "train/root_broadcast.h"

namespace {

constexpr const char* kUsage =
    "usage: dtrain train [flags]                 (dtrain train --help for the flags)\n"
    "       dtrain eval --weights FILE [flags]   (dtrain eval --help)\n"
    "       dtrain sample --weights FILE --prompt TEXT --tokens N   (text from a byte-level GPT)\n"
    "       dtrain flight-report DIR             (where a hung or timed-out job stopped)\n"
    "       dtrain bench allreduce [flags]       (dtrain bench allreduce --help)\n"
    "       dtrain data shard --bytes PATH... -o DIR (token shards from text; dtrain data shard --help)\n"
    "       dtrain checkpoint consolidate DIR [-o FILE] (a sharded checkpoint's optimizer state as one file)\n"
    "       dtrain bench gemm [flags]            (this binary's float32 GEMM rate)\n"
    "  runs on every rank it is started with: dtrain-launch -n 2 -- dtrain train --epochs 1\n";

bool is_rank_zero_before_init() {
  const std::string rank = dtrain::launcher_rank();
  return rank.empty() || rank == "0";
}

int usage_error(const std::string& message) {
  if (is_rank_zero_before_init()) {
    fmt::print(stderr, "dtrain: error: {}\n", message);
  } else {
    // mpirun tears the job down at the first non-zero exit: had another rank's come first, rank
    // 0 could be killed before its line is out (seen in e2e_pipeline_np_3, 2 runs in 6).
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  return dtrain::kExitUsage;
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

// An error every rank raised alike (train/root_broadcast.h): printed once, by rank 0, and every
// rank shuts down normally with the same status (the error's kind is agreed too), so no
// MPI_Abort is needed.
int agreed_failure(const dtrain::AgreedError& e, std::unique_ptr<dtrain::Runtime>& runtime) {
  std::fflush(stdout);
  if (runtime->rank() == 0) fmt::print(stderr, "dtrain: error: {}\n", e.what());
  runtime.reset();
  return dtrain::exit_status(e.kind());
}

// Runs `work` on a started runtime: the exit status, failures reported (and peers stopped).
// The one place where a failure becomes an exit status (Note [Exit statuses] in
// core/exit_status.h): an Error's kind says which.
template <class Work>
int with_runtime(int* argc, char*** argv, const dtrain::RuntimeOptions& options, Work work) {
  std::unique_ptr<dtrain::Runtime> runtime;
  int status = 0;
  try {
    runtime = dtrain::init(argc, argv, options);
    status = work(*runtime);
  } catch (const dtrain::AgreedError& e) {
    if (runtime) return agreed_failure(e, runtime);
    return fail(e.what(), runtime, dtrain::exit_status(e.kind()));
  } catch (const dtrain::Error& e) {
    return fail(e.what(), runtime, dtrain::exit_status(e.kind()));
  } catch (const std::bad_alloc&) {
    return fail("out of memory: an allocation failed", runtime, dtrain::kExitNoMemory);
  } catch (const std::exception& e) {
    return fail(e.what(), runtime, dtrain::kExitFailure);
  }
  runtime.reset();
  return status;
}

// Parses a command's flags (`parse` returns a struct with help, help_text and config): a usage
// error or --help ends it here, before MPI starts; otherwise `run(parsed)` gives the status.
template <class Parse, class Run>
int with_flags(const std::vector<std::string>& args, Parse parse, Run run) {
  decltype(parse(args)) parsed;
  try {
    parsed = parse(args);
  } catch (const dtrain::UsageError& e) {
    return usage_error(e.what());
  }
  if (parsed.help) {
    if (is_rank_zero_before_init()) fmt::print("{}", parsed.help_text);
    return 0;
  }
  return run(parsed);
}

int run_train(const std::vector<std::string>& args, int* argc, char*** argv) {
  return with_flags(args, dtrain::parse_train_options, [&](const dtrain::ParsedTrain& parsed) {
    return with_runtime(argc, argv, parsed.config.runtime, [&](dtrain::Runtime& runtime) {
      const dtrain::TrainResult result = dtrain::train(runtime, parsed.config);
      if (result.diverged) return dtrain::kDivergedExitStatus;  // rank 0 said what and where
      // Stopped by SIGTERM/SIGINT (rank 0 said so): the status a process ended by it would have.
      return result.stop_signal ? 128 + result.stop_signal : 0;
    });
  });
}

int run_eval(const std::vector<std::string>& args, int* argc, char*** argv) {
  return with_flags(args, dtrain::parse_eval_options, [&](const dtrain::ParsedEval& parsed) {
    return with_runtime(argc, argv, parsed.config.runtime, [&](dtrain::Runtime& runtime) {
      dtrain::run_eval(runtime, parsed.config);
      return 0;
    });
  });
}

int run_sample(const std::vector<std::string>& args, int* argc, char*** argv) {
  return with_flags(args, dtrain::parse_sample_options, [&](const dtrain::ParsedSample& parsed) {
    return with_runtime(argc, argv, parsed.config.runtime, [&](dtrain::Runtime& runtime) {
      dtrain::run_sample(runtime, parsed.config);
      return 0;
    });
  });
}

int run_bench_allreduce_command(const std::vector<std::string>& args, int* argc, char*** argv) {
  return with_flags(args, dtrain::parse_bench_allreduce_options, [&](const dtrain::ParsedBenchAllreduce& parsed) {
    return with_runtime(argc, argv, parsed.config.runtime, [&](dtrain::Runtime& runtime) {
      const int64_t wrong = dtrain::run_bench_allreduce(runtime, parsed.config);
      // Every rank knows the total, so all leave alike, without an abort.
      if (wrong > 0 && runtime.rank() == 0)
        fmt::print(stderr, "dtrain: error: bench allreduce: {} result element(s) differed from the exact sum\n", wrong);
      return wrong > 0 ? dtrain::kExitFailure : 0;
    });
  });
}

// A command without an MPI job: `work` returns its summary line; an error is one line and its
// kind's status.
template <class Work>
int run_offline(Work&& work) {
  try {
    fmt::print("{}\n", work());
    return 0;
  } catch (const dtrain::Error& e) {
    fmt::print(stderr, "dtrain: error: {}\n", e.what());
    return dtrain::exit_status(e.kind());
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "dtrain: error: out of memory: an allocation failed\n");
    return dtrain::kExitNoMemory;
  }
}

// `dtrain data shard`: no MPI job.
int run_data(const std::vector<std::string>& args) {
  if (args.empty() || args[0] != "shard")
    return usage_error(fmt::format("data: expected 'shard' (dtrain data shard --bytes PATH... -o DIR), got '{}'",
                                   args.empty() ? "" : args[0]));
  return with_flags({args.begin() + 1, args.end()}, dtrain::parse_data_shard_options,
                    [](const dtrain::ParsedDataShard& parsed) {
                      return run_offline([&] { return dtrain::run_data_shard(parsed.config); });
                    });
}

// `dtrain checkpoint consolidate`: no MPI job.
int run_checkpoint(const std::vector<std::string>& args) {
  if (args.empty() || args[0] != "consolidate")
    return usage_error(fmt::format(
        "checkpoint: expected 'consolidate' (dtrain checkpoint consolidate DIR [-o FILE]), got '{}'",
        args.empty() ? "" : args[0]));
  return with_flags({args.begin() + 1, args.end()}, dtrain::parse_consolidate_options,
                    [](const dtrain::ParsedConsolidate& parsed) {
                      return run_offline([&] { return dtrain::run_consolidate(parsed.config); });
                    });
}

int run_bench_gemm_command(const std::vector<std::string>& args, int* argc, char*** argv) {
  return with_flags(args, dtrain::parse_bench_gemm_options, [&](const dtrain::ParsedBenchGemm& parsed) {
    return with_runtime(argc, argv, parsed.config.runtime, [&](dtrain::Runtime& runtime) {
      const dtrain::GemmRate rate = dtrain::run_bench_gemm(runtime, parsed.config);
      if (rate.wrong > 0) fmt::print(stderr, "dtrain: error: bench gemm: {} result element(s) wrong\n", rate.wrong);
      return rate.wrong > 0 ? dtrain::kExitFailure : 0;
    });
  });
}

int run_bench(const std::vector<std::string>& args, int* argc, char*** argv) {
  if (!args.empty() && args[0] == "gemm") return run_bench_gemm_command({args.begin() + 1, args.end()}, argc, argv);
  if (args.empty() || args[0] != "allreduce")
    return usage_error(fmt::format("bench: expected a benchmark name ('allreduce' or 'gemm'), got '{}'",
                                   args.empty() ? "" : args[0]));
  return run_bench_allreduce_command({args.begin() + 1, args.end()}, argc, argv);
}

}  // namespace

int main(int argc, char** argv) {
  reexec_with_better_blas_kernels(argv);
  // Log lines reach a file (or a launcher's pipe) as they are printed, as on a terminal: a
  // job's log shows where it stands, and a rank killed later has already written them.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help") {
    fmt::print(args.empty() ? stderr : stdout, "{}", kUsage);
    return args.empty() ? dtrain::kExitUsage : 0;
  }
  if (args[0] == "train") return run_train({args.begin() + 1, args.end()}, &argc, &argv);
  if (args[0] == "bench") return run_bench({args.begin() + 1, args.end()}, &argc, &argv);
  if (args[0] == "eval") return run_eval({args.begin() + 1, args.end()}, &argc, &argv);
  if (args[0] == "data") return run_data({args.begin() + 1, args.end()});
  if (args[0] == "checkpoint") return run_checkpoint({args.begin() + 1, args.end()});
  if (args[0] == "sample") return run_sample({args.begin() + 1, args.end()}, &argc, &argv);
  if (args[0] == "flight-report") {
    if (args.size() != 2) return usage_error("flight-report: expected one directory (dtrain flight-report DIR)");
    try {
      return dtrain::run_flight_report(args[1]);
    } catch (const dtrain::UsageError& e) {
      return usage_error(e.what());
    } catch (const std::exception& e) {  // a folder it may not read, a dump it cannot parse
      fmt::print(stderr, "dtrain: error: flight-report: {}\n", e.what());
      return dtrain::kExitFailure;
    }
  }
  return usage_error(fmt::format(
      "unknown command '{}'; expected 'train', 'eval', 'sample', 'bench', 'data', 'checkpoint' or 'flight-report'", args[0]));
}
