// dtrain-launch: builds the mpirun command for a dtrain job, runs it, and exits with mpirun's
// status (non-zero when any rank fails), adding one line that says so when it is not zero.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"
#include "launcher/host_info.h"
#include "launcher/launch_options.h"
#include "launcher/mpirun_command.h"

using namespace dtrain::launcher;

namespace {

pid_t g_child = 0;

void forward_signal(int sig) {
  if (g_child > 0) kill(g_child, sig);
}

// Runs mpirun as a child (signals from the user are passed on) and returns its exit status.
int run_mpirun(std::vector<std::string>& cmd, bool mpi_verbose) {
  std::vector<char*> c_argv;
  for (std::string& word : cmd) c_argv.push_back(word.data());
  c_argv.push_back(nullptr);
  std::fflush(nullptr);
  g_child = fork();
  if (g_child < 0) {
    fmt::print(stderr, "dtrain-launch: cannot start {}: {}\n", cmd[0], std::strerror(errno));
    return 127;
  }
  if (g_child == 0) {
    execvp(c_argv[0], c_argv.data());
    fmt::print(stderr, "dtrain-launch: cannot run {}: {}\n", cmd[0], std::strerror(errno));
    std::fflush(stderr);
    _exit(127);
  }
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) signal(sig, forward_signal);
  int status = 0;
  while (waitpid(g_child, &status, 0) < 0 && errno == EINTR) {
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (code != 0 && code != 127)
    fmt::print(stderr, "dtrain-launch: mpirun exited with status {}{}\n", code,
               mpi_verbose ? "" : " (--mpi-verbose shows Open MPI's own messages)");
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    LaunchOptions opts = parse_launch_args(std::vector<std::string>(argv + 1, argv + argc));
    if (opts.help) {
      fmt::print("{}\n", launch_usage());
      return 0;
    }
    load_hostfile(opts);
    const LaunchHost host = current_host();
    opts = resolve_launch(std::move(opts), host);
    std::vector<std::string> cmd = build_mpirun_argv(opts, host);
    if (opts.dry_run) {
      fmt::print("{}\n", shell_join(cmd));
      return 0;
    }
    return run_mpirun(cmd, opts.mpi_verbose);
  } catch (const dtrain::UsageError& e) {
    fmt::print(stderr, "dtrain-launch: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dtrain-launch: {}\n", e.what());
    return 1;
  }
}
