// Builds the mpirun argv from the launch options and this machine's cores, user and env.
#include "launcher/mpirun_command.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain::launcher {

namespace {

size_t distinct_nodes(const std::vector<HostSlots>& hosts) {
  std::set<std::string> names;
  for (const HostSlots& h : hosts) names.insert(h.name);
  return std::max<size_t>(1, names.size());
}

}  // namespace

LaunchPlan plan_launch(const LaunchOptions& opts, const LaunchHost& host) {
  LaunchPlan plan;
  const int nodes = static_cast<int>(distinct_nodes(opts.hosts));
  plan.single_node = nodes == 1;
  const int cores = std::max(1, host.cores);
  if (opts.gpus_per_node > 0) {
    if (opts.np > opts.gpus_per_node * nodes)
      throw UsageError(fmt::format("-n {} needs more than {} node(s) at --gpus-per-node {}", opts.np, nodes,
                                   opts.gpus_per_node));
    plan.ranks_per_node = std::min(opts.np, opts.gpus_per_node);
  } else if (plan.single_node) {
    plan.ranks_per_node = opts.np;
  } else {
    // mpirun fills nodes slot by slot; a hostfile line without slots= is taken as an even share.
    bool all_stated = std::all_of(opts.hosts.begin(), opts.hosts.end(), [](const HostSlots& h) { return h.slots > 0; });
    int most = 0;
    for (const HostSlots& h : opts.hosts) most = std::max(most, h.slots);
    plan.ranks_per_node = all_stated ? std::min(opts.np, most) : (opts.np + nodes - 1) / nodes;
  }
  plan.threads_per_rank = std::max(1, cores / plan.ranks_per_node);
  plan.bind_to_core = plan.ranks_per_node <= cores;
  plan.oversubscribe = plan.single_node && opts.np > cores;
  return plan;
}

bool is_forwarded_env(std::string_view name) {
  return name == "CUDA_VISIBLE_DEVICES" || name == "OMP_NUM_THREADS" || name == "OPENBLAS_NUM_THREADS" ||
         name.starts_with("NCCL_") || name.starts_with("DTRAIN_");
}

std::vector<std::string> build_mpirun_argv(const LaunchOptions& opts, const LaunchHost& host) {
  const LaunchPlan plan = plan_launch(opts, host);
  std::vector<std::string> argv{opts.mpirun, "-np", std::to_string(opts.np)};
  if (!opts.hosts_flag.empty()) argv.insert(argv.end(), {"--host", opts.hosts_flag});
  if (!opts.hostfile.empty()) argv.insert(argv.end(), {"--hostfile", opts.hostfile});

  // One rank per GPU or per core; a rank with several threads gets that many cores (PE=).
  std::string pe = plan.threads_per_rank > 1 ? fmt::format(":PE={}", plan.threads_per_rank) : "";
  if (!plan.bind_to_core) pe.clear();
  if (opts.gpus_per_node > 0) {
    argv.insert(argv.end(), {"--map-by", fmt::format("ppr:{}:node{}", opts.gpus_per_node, pe)});
  } else if (plan.bind_to_core) {
    argv.insert(argv.end(), {"--map-by", pe.empty() ? "core" : "slot" + pe});
  }
  argv.insert(argv.end(), {"--bind-to", plan.bind_to_core ? "core" : "none"});
  if (plan.oversubscribe) argv.push_back("--oversubscribe");
  if (host.is_root) argv.push_back("--allow-run-as-root");
  // A failing rank prints its own one-line error; Open MPI's MPI_ABORT banner only repeats it.
  // The launcher reports mpirun's exit status itself, so nothing fails silently.
  if (!opts.mpi_verbose) argv.insert(argv.end(), {"--mca", "orte_execute_quiet", "1"});

  // Forward by name (mpirun reads the value), so the printed command carries no values.
  for (const auto& [name, value] : host.env) {
    if (is_forwarded_env(name)) argv.insert(argv.end(), {"-x", name});
  }
  if (!host.env.contains("OPENBLAS_NUM_THREADS"))
    argv.insert(argv.end(), {"-x", fmt::format("OPENBLAS_NUM_THREADS={}", plan.threads_per_rank)});

  argv.insert(argv.end(), opts.program.begin(), opts.program.end());
  return argv;
}

std::string shell_quote(std::string_view word) {
  auto safe = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string_view("_@%+=:,./-").find(c) != std::string_view::npos;
  };
  if (!word.empty() && std::all_of(word.begin(), word.end(), safe)) return std::string(word);
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string shell_join(const std::vector<std::string>& argv) {
  std::string line;
  for (const std::string& word : argv) {
    if (!line.empty()) line += ' ';
    line += shell_quote(word);
  }
  return line;
}

}  // namespace dtrain::launcher
