// A stand-in for a dtrain rank, for dtrain-launch's supervision tests: it reports reaching
// training through the real library call (comm/launch_channel.h), runs for a while, and fails
// the way a test asks, on the rank the test names (OMPI_COMM_WORLD_RANK). It also plays a
// trainer with checkpoints for the restart tests: it records each start's arguments and fails
// unless it was restarted with `--resume auto`.
//   launch_test_rank [--run S] [--silent-rank R] [--ignore-sigterm] [--pid-dir DIR]
//                    [--fail-rank R --fail-after S --fail kill|segv|exit:N [--error-line TEXT]]
//                    [--checkpoint-dir DIR [--resume auto] [--always-fail]]
// --silent-rank R: rank R never reports reaching training. --pid-dir: each rank writes its pid
// there (rank.R.pid), so a test can check that none is left. With --checkpoint-dir the failure
// (--fail...) happens only on a start without `--resume auto` (or on every start with
// --always-fail); every start appends its arguments to DIR/starts.R.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/launch_channel.h"

namespace {

struct Options {
  double run_s = 1000;
  int silent_rank = -1;
  bool ignore_sigterm = false;
  std::string pid_dir;
  int fail_rank = -1;
  double fail_after_s = 0;
  std::string fail_how = "exit:1";
  std::string error_line;
  std::string checkpoint_dir;
  bool resumed = false;
  bool always_fail = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "launch_test_rank: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--run") o.run_s = std::stod(value());
    else if (a == "--silent-rank") o.silent_rank = std::stoi(value());
    else if (a == "--ignore-sigterm") o.ignore_sigterm = true;
    else if (a == "--pid-dir") o.pid_dir = value();
    else if (a == "--fail-rank") o.fail_rank = std::stoi(value());
    else if (a == "--fail-after") o.fail_after_s = std::stod(value());
    else if (a == "--fail") o.fail_how = value();
    else if (a == "--error-line") o.error_line = value();
    else if (a == "--checkpoint-dir") o.checkpoint_dir = value();
    else if (a == "--resume") o.resumed = value() == "auto";
    else if (a == "--always-fail") o.always_fail = true;
    else {
      std::fprintf(stderr, "launch_test_rank: unknown argument %s\n", a.c_str());
      std::exit(2);
    }
  }
  return o;
}

void sleep_s(double seconds) { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); }

[[noreturn]] void fail(const Options& o) {
  if (!o.error_line.empty()) std::fprintf(stderr, "%s\n", o.error_line.c_str());
  std::fflush(stderr);
  if (o.fail_how == "kill") raise(SIGKILL);
  if (o.fail_how == "segv") raise(SIGSEGV);
  std::exit(o.fail_how.starts_with("exit:") ? std::atoi(o.fail_how.c_str() + 5) : 1);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const char* rank_text = std::getenv("OMPI_COMM_WORLD_RANK");
  const int rank = rank_text ? std::atoi(rank_text) : 0;
  if (o.ignore_sigterm) signal(SIGTERM, SIG_IGN);
  if (!o.pid_dir.empty()) std::ofstream(o.pid_dir + "/rank." + std::to_string(rank) + ".pid") << getpid() << "\n";
  bool may_fail = true;
  if (!o.checkpoint_dir.empty()) {
    std::ofstream starts(o.checkpoint_dir + "/starts." + std::to_string(rank), std::ios::app);
    for (int i = 1; i < argc; ++i) starts << (i > 1 ? " " : "") << argv[i];
    starts << "\n";
    may_fail = !o.resumed || o.always_fail;
  }
  if (rank != o.silent_rank) dtrain::report_reached_training();
  if (rank == o.fail_rank && may_fail) {
    sleep_s(o.fail_after_s);
    fail(o);
  }
  std::printf("rank %d running\n", rank);
  std::fflush(stdout);
  sleep_s(o.run_s);
  return 0;
}
