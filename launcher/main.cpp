// dtrain-launch: builds the mpirun command for a dtrain job and runs it in place of itself
// (exec), so mpirun's exit status — non-zero when any rank fails — is the launcher's.
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

int main(int argc, char** argv) {
  try {
    LaunchOptions opts = parse_launch_args(std::vector<std::string>(argv + 1, argv + argc));
    if (opts.help) {
      fmt::print("{}\n", launch_usage());
      return 0;
    }
    load_hostfile(opts);
    std::vector<std::string> cmd = build_mpirun_argv(opts, current_host());
    if (opts.dry_run) {
      fmt::print("{}\n", shell_join(cmd));
      return 0;
    }
    std::vector<char*> c_argv;
    for (std::string& word : cmd) c_argv.push_back(word.data());
    c_argv.push_back(nullptr);
    std::fflush(nullptr);
    execvp(c_argv[0], c_argv.data());
    fmt::print(stderr, "dtrain-launch: cannot run {}: {}\n", cmd[0], std::strerror(errno));
    return 127;
  } catch (const dtrain::UsageError& e) {
    fmt::print(stderr, "dtrain-launch: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dtrain-launch: {}\n", e.what());
    return 1;
  }
}
