// dtrain-launch's command line: `dtrain-launch [-n N] [--hosts h1:2,h2:2 | --hostfile F]
// [--gpus-per-node G] [--iface NAME|CIDR] [--start-timeout S] [--max-restarts K] [--dry-run]
// [--mpirun PATH] -- program args...`, parsed into LaunchOptions. Wrong flags throw
// dtrain::UsageError (the launcher exits 2).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dtrain::launcher {

// One node and how many ranks it takes. slots == 0: not stated (a hostfile line without slots=).
struct HostSlots {
  std::string name;
  int slots = 0;
  friend bool operator==(const HostSlots&, const HostSlots&) = default;
};

struct LaunchOptions {
  int np = 0;                    // 0: not given; resolve_launch makes it the total slots
  std::string hosts_flag;        // --hosts as given ("h1:2,h2:2"), passed to mpirun --host
  std::string hostfile;          // --hostfile path, passed to mpirun --hostfile
  std::vector<HostSlots> hosts;  // the nodes named by either, or by Slurm (empty: this node only)
  bool hosts_from_slurm = false;  // hosts came from the Slurm allocation (resolve_launch)
  int gpus_per_node = 0;         // 0: CPU ranks, one per core
  std::string iface;             // network for Open MPI's TCP and out-of-band traffic ("" = Open MPI's choice)
  bool dry_run = false;
  bool mpi_verbose = false;  // keep Open MPI's multi-line abort banners and help messages
  bool help = false;
  std::string mpirun = "mpirun";
  double stop_timeout_s = 30;    // --stop-timeout: after an interrupt, then the ranks are killed
  double start_timeout_s = 300;  // --start-timeout: every rank must reach training within it; 0: no bound
  int max_restarts = 0;          // --max-restarts: relaunch a failed job this often, with --resume auto
  std::vector<std::string> program;  // everything after `--`

  // Set by dtrain-launch itself, not by flags: the words mpirun runs before the program on every
  // rank (the rank supervisor) and NAME=VALUE settings every rank gets (-x).
  std::vector<std::string> rank_supervisor;
  std::vector<std::string> rank_env;
};

// Parses the arguments after argv[0]. Does not read the hostfile (see load_hostfile).
LaunchOptions parse_launch_args(const std::vector<std::string>& args);

// Reads opts.hostfile (when set) into opts.hosts; an unreadable or empty file is a UsageError.
void load_hostfile(LaunchOptions& opts);

// "h1:2,h2" -> {h1, 2}, {h2, 1} (mpirun --host semantics: no count means one slot).
std::vector<HostSlots> parse_hosts(std::string_view spec);
// Open MPI hostfile text: "node1 slots=4 [max_slots=..]" per line, '#' comments.
std::vector<HostSlots> parse_hostfile(std::string_view text);

std::string launch_usage();

}  // namespace dtrain::launcher
