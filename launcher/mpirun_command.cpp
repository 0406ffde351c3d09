// Builds the mpirun argv from the launch options and this machine's cores, user and env.
#include "launcher/mpirun_command.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <set>

#include <fmt/format.h>

#include "core/error.h"
#include "core/thread_policy.h"
#include "launcher/slurm.h"

namespace dtrain::launcher {

namespace {

size_t distinct_nodes(const std::vector<HostSlots>& hosts) {
  std::set<std::string> names;
  for (const HostSlots& h : hosts) names.insert(h.name);
  return std::max<size_t>(1, names.size());
}

// Where the hosts came from, for messages.
std::string host_source(const LaunchOptions& opts) {
  if (opts.hosts_from_slurm) return "the Slurm allocation";
  if (!opts.hostfile.empty()) return fmt::format("--hostfile {}", opts.hostfile);
  return fmt::format("--hosts {}", opts.hosts_flag);
}

// "a:2,b:2" for mpirun --host; "" when a count is unknown (mpirun then reads the allocation).
std::string host_list(const std::vector<HostSlots>& hosts) {
  std::string list;
  for (const HostSlots& h : hosts) {
    if (h.slots < 1) return "";
    list += fmt::format("{}{}:{}", list.empty() ? "" : ",", h.name, h.slots);
  }
  return list;
}

}  // namespace

LaunchOptions resolve_launch(LaunchOptions opts, const LaunchHost& host) {
  if (!opts.iface.empty() && !host.interfaces.empty()) {
    if (std::string item = unmatched_iface(opts.iface, host.interfaces); !item.empty())
      throw UsageError(fmt::format("--iface: '{}' matches no interface of this node ({})", item,
                                   describe_interfaces(host.interfaces)));
  }
  if (opts.hosts.empty() && opts.hostfile.empty()) {
    opts.hosts = slurm_hosts(host.env);
    opts.hosts_from_slurm = !opts.hosts.empty();
    opts.hosts_flag = host_list(opts.hosts);
  }
  if (opts.hosts.empty()) {
    if (opts.np == 0)
      throw UsageError(
          "-n (number of ranks) is required when neither --hosts, --hostfile nor a Slurm allocation gives slots");
    return opts;
  }
  auto unstated = std::find_if(opts.hosts.begin(), opts.hosts.end(), [](const HostSlots& h) { return h.slots < 1; });
  if (unstated != opts.hosts.end()) {
    if (opts.np == 0)
      throw UsageError(fmt::format("-n (number of ranks) is required: {} gives no slot count for {}", host_source(opts),
                                   unstated->name));
    return opts;
  }
  int64_t slots = 0;
  for (const HostSlots& h : opts.hosts) slots += h.slots;
  if (opts.np == 0) {
    if (slots > std::numeric_limits<int>::max())
      throw UsageError(fmt::format("{} gives {} slots, more ranks than one job can have", host_source(opts), slots));
    opts.np = static_cast<int>(slots);
  } else if (opts.np > slots) {
    throw UsageError(fmt::format("-n {} is more ranks than the {} slot(s) of {}", opts.np, slots, host_source(opts)));
  }
  return opts;
}

LaunchPlan plan_launch(const LaunchOptions& opts, const LaunchHost& host) {
  DTRAIN_CHECK(opts.np > 0, "plan_launch: the rank count is not resolved (resolve_launch)");
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
  plan.threads_per_rank = threads_per_rank(cores, plan.ranks_per_node);
  plan.bind_to_core = plan.ranks_per_node <= cores;
  plan.oversubscribe = plan.single_node && opts.np > cores;
  return plan;
}

// OPENBLAS_CORETYPE: every node's ranks run the GEMM kernels the user chose, or a rank on a node
// left to detect its own computes other bits than its peers (a P x D pipeline across two nodes
// differed from the same job on one node in every tensor: tests/multinode/gpt_pipeline_zero2_test.sh).
bool is_forwarded_env(std::string_view name) {
  return name == "CUDA_VISIBLE_DEVICES" || name == "OMP_NUM_THREADS" || name == "OPENBLAS_NUM_THREADS" ||
         name == "OPENBLAS_CORETYPE" ||
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
  // The network between nodes: MPI's TCP messages and mpirun's own out-of-band traffic (its
  // daemons' wire-up, the classic multi-node hang when it picks an unreachable interface).
  if (!opts.iface.empty())
    argv.insert(argv.end(), {"--mca", "btl_tcp_if_include", opts.iface, "--mca", "oob_tcp_if_include", opts.iface});

  // Forward by name (mpirun reads the value), so the printed command carries no values.
  for (const auto& [name, value] : host.env) {
    if (is_forwarded_env(name)) argv.insert(argv.end(), {"-x", name});
  }
  if (!host.env.contains("OPENBLAS_NUM_THREADS"))
    argv.insert(argv.end(), {"-x", fmt::format("OPENBLAS_NUM_THREADS={}", plan.threads_per_rank)});
  // Under mpirun a rank's stdout is a pseudo-terminal even when the job's output goes to a file:
  // the ranks learn from here whether a person is watching (dtrain's progress line).
  if (!host.env.contains("DTRAIN_STDOUT_IS_TTY"))
    argv.insert(argv.end(), {"-x", fmt::format("DTRAIN_STDOUT_IS_TTY={}", host.stdout_is_tty ? 1 : 0)});

  // NCCL's bootstrap and sockets on the same network (a user's own NCCL_SOCKET_IFNAME wins).
  if (!opts.iface.empty() && !host.env.contains("NCCL_SOCKET_IFNAME")) {
    if (const std::string ifname = nccl_socket_ifname(opts.iface, host.interfaces); !ifname.empty())
      argv.insert(argv.end(), {"-x", "NCCL_SOCKET_IFNAME=" + ifname});
  }

  for (const std::string& setting : opts.rank_env) argv.insert(argv.end(), {"-x", setting});

  argv.insert(argv.end(), opts.rank_supervisor.begin(), opts.rank_supervisor.end());
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
