// dtrain-launch: starts a dtrain job under mpirun with a rank supervisor around every rank, and
// watches it: a rank that dies is named in one line (rank, host, signal or exit status, its last
// line on stderr) and the job ends within seconds; start-up is bounded (--start-timeout); Ctrl-C
// or SIGTERM is passed to every rank (dtrain train saves a checkpoint and stops); a failed job can be restarted from its checkpoints (--max-restarts). Exits
// with the failed rank's status (0 when every rank succeeds). `dtrain-launch --rank-supervisor
// -- PROGRAM...` is the supervisor itself, as mpirun starts it.
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <climits>
#include <random>

#include <fmt/format.h>

#include "core/error.h"
#include "launcher/host_info.h"
#include "launcher/job_runner.h"
#include "launcher/launch_options.h"
#include "launcher/mpirun_command.h"
#include "launcher/rank_supervisor.h"
#include "launcher/restart_policy.h"

using namespace dtrain::launcher;

namespace {

constexpr const char* kSupervisorFlag = "--rank-supervisor";

std::string self_path() {
  char path[PATH_MAX] = {};
  const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) throw dtrain::Error("cannot find dtrain-launch's own path (/proc/self/exe)");
  return std::string(path, static_cast<size_t>(n));
}

// A secret per attempt, so that only this attempt's supervisors are listened to.
std::string new_token(int attempt) {
  std::random_device random;
  return fmt::format("{:08x}{:08x}{:08x}-{}", random(), random(), random(), attempt);
}

// Waits `how_long` unless interrupted first: then the signal, else 0.
int wait_unless_interrupted(std::chrono::milliseconds how_long, SignalPipe& signals) {
  const auto until = Clock::now() + how_long;
  while (Clock::now() < until) {
    pollfd p{signals.fd(), POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    if (poll(&p, 1, static_cast<int>(std::max<int64_t>(left, 0))) > 0) {
      for (int s : signals.take())
        if (s == SIGINT || s == SIGTERM || s == SIGHUP || s == SIGQUIT) return s;
    }
  }
  return 0;
}

int run_supervised(const LaunchOptions& opts, const LaunchHost& host) {
  const bool single_node = plan_launch(opts, host).single_node;
  SignalPipe signals{SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCHLD};
  Listener listener = listen_tcp(single_node);
  std::string addresses;
  for (uint32_t a : addresses_for_ranks(opts.iface, host.interfaces, single_node))
    addresses += fmt::format("{}{}:{}", addresses.empty() ? "" : ",", ipv4_text(a), listener.port);

  JobAttempt attempt;
  attempt.np = opts.np;
  attempt.timings.stop_grace = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(opts.stop_timeout_s));
  attempt.timings.start_timeout = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(opts.start_timeout_s));
  for (int restarts = 0;; ++restarts) {
    LaunchOptions run = opts;
    if (restarts > 0) run.program = with_resume_auto(opts.program);
    attempt.token = new_token(restarts);
    run.rank_supervisor = {self_path(), kSupervisorFlag, "--"};
    run.rank_env = {fmt::format("{}={}", kLaunchAddressesEnv, addresses), fmt::format("{}={}", kLaunchTokenEnv, attempt.token)};
    attempt.mpirun_argv = build_mpirun_argv(run, host);
    JobOutcome outcome = run_job_attempt(attempt, listener, signals);
    if (outcome.kind == JobOutcome::Kind::kSucceeded) return 0;
    if (outcome.kind == JobOutcome::Kind::kMpirunFailed && !opts.mpi_verbose)
      outcome.cause += " (--mpi-verbose shows Open MPI's own messages)";
    const RestartDecision decision = decide_restart(outcome, restarts, opts.max_restarts);
    fmt::print(stderr, "dtrain-launch: {}\n", decision.line);
    std::fflush(stderr);
    if (!decision.restart) return outcome.exit_status;
    if (const int signal = wait_unless_interrupted(decision.backoff, signals)) {
      fmt::print(stderr, "dtrain-launch: interrupted by {} before restart {}\n", signal_name(signal), restarts + 1);
      return 128 + signal;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string_view(argv[1]) == kSupervisorFlag) {
    const int first = argc >= 3 && std::string_view(argv[2]) == "--" ? 3 : 2;
    return run_rank_supervisor(std::vector<std::string>(argv + first, argv + argc));
  }
  try {
    LaunchOptions opts = parse_launch_args(std::vector<std::string>(argv + 1, argv + argc));
    if (opts.help) {
      fmt::print("{}\n", launch_usage());
      return 0;
    }
    load_hostfile(opts);
    const LaunchHost host = current_host();
    opts = resolve_launch(std::move(opts), host);
    if (opts.dry_run) {
      fmt::print("{}\n", shell_join(build_mpirun_argv(opts, host)));
      return 0;
    }
    return run_supervised(opts, host);
  } catch (const dtrain::UsageError& e) {
    fmt::print(stderr, "dtrain-launch: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dtrain-launch: {}\n", e.what());
    return 1;
  }
}
