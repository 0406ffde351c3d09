// The mpirun command dtrain-launch runs: pure logic from LaunchOptions and the facts about
// this machine (LaunchHost), so every decision is testable without starting anything.
//   mpirun -np N [--host LIST | --hostfile F] [--map-by M] --bind-to core|none [--oversubscribe]
//          [--allow-run-as-root] [--mca btl_tcp_if_include I --mca oob_tcp_if_include I]
//          -x VAR... [-x NAME=VALUE...] [RANK SUPERVISOR] PROGRAM ARGS...
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/iface.h"
#include "launcher/launch_options.h"

namespace dtrain::launcher {

// What the command depends on besides the flags. Remote nodes are assumed to have as many
// cores as this one (a homogeneous cluster).
struct LaunchHost {
  int cores = 1;         // physical cores this process may run on
  bool is_root = false;  // Open MPI 4 refuses root without --allow-run-as-root
  bool stdout_is_tty = false;  // the launcher's own stdout: whether the user watches a terminal
  std::map<std::string, std::string> env;  // the caller's environment
  std::vector<NetInterface> interfaces;    // this node's IPv4 addresses (empty: not known, --iface unchecked)
};

// The decisions behind the command.
struct LaunchPlan {
  bool single_node = true;
  int ranks_per_node = 1;    // the most ranks any node runs
  int threads_per_rank = 1;  // core/thread_policy.h: OPENBLAS_NUM_THREADS and cores bound per rank
  bool bind_to_core = true;  // false when ranks_per_node > cores
  bool oversubscribe = false;  // more ranks than cores on a single node
};

// Completes the options from where the job runs: inside a Slurm allocation without --hosts or
// --hostfile, the allocation's nodes and tasks per node (host.env); -n, when not given, is the
// total of the slots. Throws UsageError when -n is missing and no slot counts are known, when
// -n is more than the slots stated, or when --iface names no network this node is on (mpirun's
// out-of-band traffic starts here).
LaunchOptions resolve_launch(LaunchOptions opts, const LaunchHost& host);

// Expects resolved options (np > 0). Throws UsageError when the ranks cannot be placed (e.g. -n
// above gpus-per-node x nodes).
LaunchPlan plan_launch(const LaunchOptions& opts, const LaunchHost& host);
std::vector<std::string> build_mpirun_argv(const LaunchOptions& opts, const LaunchHost& host);

// Environment variables the ranks need that mpirun would not pass to remote nodes itself:
// CUDA_VISIBLE_DEVICES, NCCL_*, DTRAIN_*, OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, when set.
bool is_forwarded_env(std::string_view name);

// POSIX shell quoting: safe words unchanged, others in single quotes.
std::string shell_quote(std::string_view word);
std::string shell_join(const std::vector<std::string>& argv);

}  // namespace dtrain::launcher
