// Parsing of dtrain-launch's flags, --hosts lists and Open MPI hostfiles.
#include "launcher/launch_options.h"

#include <charconv>
#include <fstream>
#include <sstream>


#include "core/command_line.h"
#include "core/error.h"
#include "launcher/iface.h"
#include "launcher/restart_policy.h"

namespace dtrain::launcher {

namespace {

cxxopts::Options make_options() {
  cxxopts::Options options("dtrain-launch", "Starts a dtrain job under mpirun, one rank per GPU or core.");
  options.custom_help("[-n N] [OPTION...] -- PROGRAM [ARGS...]");
  options.add_options()
      ("n,np", "number of ranks (default: the slots of --hosts, --hostfile or the Slurm allocation)",
       cxxopts::value<std::string>())
      ("hosts", "nodes and ranks per node, e.g. h1:2,h2:2 (inside Slurm: the allocation's)",
       cxxopts::value<std::string>())
      ("hostfile", "Open MPI hostfile", cxxopts::value<std::string>())
      ("gpus-per-node", "one rank per GPU, this many per node", cxxopts::value<std::string>())
      ("iface", "network for Open MPI's TCP and out-of-band traffic and for the ranks' reports to dtrain-launch: "
                "interface names or IPv4 CIDRs, e.g. eth1 or 10.1.0.0/16", cxxopts::value<std::string>())
      ("start-timeout", "seconds within which every rank must reach training, or the job is ended naming the ranks "
                        "that did not (0: no bound)", cxxopts::value<std::string>()->default_value("300"))
      ("stop-timeout", "seconds the ranks get after Ctrl-C or SIGTERM to stop on their own (dtrain train: at a step "
                       "boundary, rank 0 saving a checkpoint) before they are killed; a second signal kills at once",
       cxxopts::value<std::string>()->default_value("30"))
      ("max-restarts", "when the job fails, start it again this many times, adding --resume auto to the program's "
                       "arguments (which must include --checkpoint-dir)", cxxopts::value<std::string>()->default_value("0"))
      ("dry-run", "print the mpirun command (without dtrain-launch's rank supervisors) and exit")
      ("mpi-verbose", "show Open MPI's own error and help messages (hidden by default: ranks print one line each)")
      ("mpirun", "mpirun to run", cxxopts::value<std::string>()->default_value("mpirun"))
      ("h,help", "show this help");
  return options;
}

int parse_count(std::string_view text, std::string_view what) {
  int value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || value < 0)
    throw UsageError(fmt::format("{}: '{}' is not a whole number of 0 or more", what, text));
  return value;
}

double parse_seconds(std::string_view text, std::string_view what) {
  double value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  // A bound of more than a year is a typo; it would also overflow the clock's arithmetic.
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || !(value >= 0) || value > 3.2e7)
    throw UsageError(fmt::format("{}: '{}' is not a number of seconds from 0 to 32000000", what, text));
  return value;
}

int parse_positive(std::string_view text, std::string_view what) {
  int value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || value < 1)
    throw UsageError(fmt::format("{}: '{}' is not a positive integer", what, text));
  return value;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

}  // namespace

std::string launch_usage() { return make_options().help(); }

std::vector<HostSlots> parse_hosts(std::string_view spec) {
  std::vector<HostSlots> hosts;
  while (true) {
    size_t comma = spec.find(',');
    std::string_view item = spec.substr(0, comma);
    size_t colon = item.rfind(':');
    HostSlots host{std::string(item.substr(0, colon)), 1};
    if (colon != std::string_view::npos) host.slots = parse_positive(item.substr(colon + 1), "--hosts slot count");
    if (host.name.empty()) throw UsageError(fmt::format("--hosts: empty host name in '{}'", spec));
    hosts.push_back(std::move(host));
    if (comma == std::string_view::npos) break;
    spec.remove_prefix(comma + 1);
  }
  return hosts;
}

std::vector<HostSlots> parse_hostfile(std::string_view text) {
  std::vector<HostSlots> hosts;
  std::istringstream in{std::string(text)};
  std::string line;
  while (std::getline(in, line)) {
    std::string_view rest = trim(std::string_view(line).substr(0, line.find('#')));
    if (rest.empty()) continue;
    std::istringstream words{std::string(rest)};
    HostSlots host;
    words >> host.name;
    for (std::string word; words >> word;) {
      if (word.starts_with("slots=")) host.slots = parse_positive(std::string_view(word).substr(6), "hostfile slots");
    }
    hosts.push_back(std::move(host));
  }
  return hosts;
}

LaunchOptions parse_launch_args(const std::vector<std::string>& args) {
  LaunchOptions opts;
  // Everything after the first `--` is the program, untouched by the flag parser.
  auto dashdash = std::find(args.begin(), args.end(), "--");
  if (dashdash != args.end()) opts.program.assign(dashdash + 1, args.end());

  cxxopts::Options options = make_options();
  const ParsedFlags flags =
      parse_flags(options, {args.begin(), dashdash}, " (the program to run goes after --)");
  if (flags.help) {
    opts.help = true;
    return opts;
  }
  const cxxopts::ParseResult& result = flags.result;
  if (result.count("np")) opts.np = parse_positive(result["np"].as<std::string>(), "-n");
  if (result.count("hosts") && result.count("hostfile")) throw UsageError("give --hosts or --hostfile, not both");
  if (result.count("hosts")) {
    opts.hosts_flag = result["hosts"].as<std::string>();
    opts.hosts = parse_hosts(opts.hosts_flag);
  }
  if (result.count("hostfile")) {
    opts.hostfile = result["hostfile"].as<std::string>();
    if (opts.hostfile.empty()) throw UsageError("--hostfile: empty path");
  }
  if (result.count("gpus-per-node"))
    opts.gpus_per_node = parse_positive(result["gpus-per-node"].as<std::string>(), "--gpus-per-node");
  if (result.count("iface")) {
    opts.iface = result["iface"].as<std::string>();
    check_iface(opts.iface);
  }
  opts.start_timeout_s = parse_seconds(result["start-timeout"].as<std::string>(), "--start-timeout");
  opts.stop_timeout_s = parse_seconds(result["stop-timeout"].as<std::string>(), "--stop-timeout");
  opts.max_restarts = parse_count(result["max-restarts"].as<std::string>(), "--max-restarts");
  opts.dry_run = result.count("dry-run") > 0;
  opts.mpi_verbose = result.count("mpi-verbose") > 0;
  opts.mpirun = result["mpirun"].as<std::string>();
  if (opts.mpirun.empty()) throw UsageError("--mpirun: empty path");
  if (opts.program.empty()) throw UsageError("no program to run: put it after --, e.g. dtrain-launch -n 2 -- dtrain train");
  if (opts.max_restarts > 0 && !has_checkpoint_dir(opts.program))
    throw UsageError("--max-restarts needs checkpoints to resume from: give the program --checkpoint-dir DIR");
  return opts;
}

void load_hostfile(LaunchOptions& opts) {
  if (opts.hostfile.empty()) return;
  std::ifstream in(opts.hostfile);
  if (!in) throw UsageError(fmt::format("--hostfile: cannot read '{}'", opts.hostfile));
  std::stringstream text;
  text << in.rdbuf();
  opts.hosts = parse_hostfile(text.str());
  if (opts.hosts.empty()) throw UsageError(fmt::format("--hostfile: '{}' names no host", opts.hostfile));
}

}  // namespace dtrain::launcher
