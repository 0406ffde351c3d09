// The rank supervisor's process handling (see rank_supervisor.h).
#include "launcher/rank_supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "comm/launch_channel.h"
#include "launcher/channel_protocol.h"
#include "launcher/posix_io.h"
#include "launcher/rank_exit.h"

namespace dtrain::launcher {

namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

// A program told to stop gets this long before SIGKILL (Open MPI's own odls_base_sigkill_timeout).
constexpr milliseconds kStopGrace{1000};
// After the program ends, its stderr may still hold lines (or a grandchild may keep it open).
constexpr milliseconds kStderrDrain{200};
constexpr milliseconds kConnectTimeout{10000};

// This rank's number as the launcher's variables give it; -1 when none does.
int rank_from_env() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* value = std::getenv(name)) return std::atoi(value);
  }
  return -1;
}

std::string host_name() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

// The child: stderr into the pipe, the channel's socket inherited, then the program.
[[noreturn]] void exec_program(const std::vector<std::string>& program, int stderr_fd, int channel_fd, pid_t parent) {
  restore_default_signals();
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // the supervisor killed: the program goes too
  if (getppid() != parent) _exit(1);
  dup2(stderr_fd, STDERR_FILENO);
  setenv(kLaunchChannelFdEnv, std::to_string(channel_fd).c_str(), 1);
  unsetenv(kLaunchAddressesEnv);
  unsetenv(kLaunchTokenEnv);
  std::vector<char*> argv;
  for (const std::string& word : program) argv.push_back(const_cast<char*>(word.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  const int error = errno;
  std::fprintf(stderr, "dtrain-launch: cannot run %s: %s\n", argv[0], std::strerror(error));
  _exit(error == ENOENT ? 127 : 126);
}

class Supervisor {
 public:
  Supervisor(Fd launcher, const std::vector<std::string>& program);
  int run();

 private:
  void on_signals();
  void on_stderr();
  void on_channel();
  void on_launcher();
  void stop(SteadyClock::time_point now);
  void drain_stderr();
  int poll_timeout_ms(SteadyClock::time_point now) const;

  SignalPipe signals_{SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCHLD};
  Fd launcher_, stderr_, channel_;
  pid_t child_ = -1;
  std::optional<int> status_;  // waitpid status once the program ended
  bool stopped_ = false;
  std::optional<SteadyClock::time_point> kill_at_;
  bool reported_training_ = false;
  LastLine last_line_;
  LineSplitter channel_lines_, launcher_lines_;
};

Supervisor::Supervisor(Fd launcher, const std::vector<std::string>& program) : launcher_(std::move(launcher)) {
  int err[2], chan[2];
  if (pipe2(err, O_CLOEXEC) != 0 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, chan) != 0)
    throw std::runtime_error(fmt::format("cannot create pipes: {}", std::strerror(errno)));
  stderr_.reset(err[0]);
  channel_.reset(chan[0]);
  Fd err_write(err[1]), chan_child(chan[1]);
  const pid_t self = getpid();
  std::fflush(nullptr);
  child_ = fork();
  if (child_ < 0) throw std::runtime_error(fmt::format("cannot fork: {}", std::strerror(errno)));
  if (child_ == 0) {
    // The channel's end must survive exec: a copy without FD_CLOEXEC.
    const int inherited = dup(chan_child.get());
    exec_program(program, err_write.get(), inherited, self);
  }
}

int Supervisor::run() {
  while (!status_) {
    std::vector<pollfd> polls{{signals_.fd(), POLLIN, 0}};
    for (const Fd* fd : {&stderr_, &channel_, &launcher_})
      if (*fd) polls.push_back({fd->get(), POLLIN, 0});
    if (poll(polls.data(), polls.size(), poll_timeout_ms(SteadyClock::now())) < 0 && errno != EINTR) break;
    for (const pollfd& p : polls) {
      if (p.revents == 0) continue;
      if (p.fd == signals_.fd()) on_signals();
      if (stderr_ && p.fd == stderr_.get()) on_stderr();
      if (channel_ && p.fd == channel_.get()) on_channel();
      if (launcher_ && p.fd == launcher_.get()) on_launcher();
    }
    if (!status_ && kill_at_ && SteadyClock::now() >= *kill_at_) {
      kill(child_, SIGKILL);
      kill_at_.reset();
    }
  }
  if (!status_) {  // poll failed: nothing left to watch but the program itself
    int status = 0;
    while (waitpid(child_, &status, 0) < 0 && errno == EINTR) {
    }
    status_ = status;
  }
  drain_stderr();
  RankExit e;
  const int status = *status_;
  e.how = WIFSIGNALED(status) ? RankExit::How::kSignaled : RankExit::How::kExited;
  e.code = WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status);
  e.stopped = stopped_;
  e.last_line = last_line_.line();
  if (launcher_) write_all(launcher_.get(), encode_exit(e));
  return exit_status(e);
}

void Supervisor::on_signals() {
  for (int signal : signals_.take()) {
    if (signal == SIGCHLD) {
      int status = 0;
      if (waitpid(child_, &status, WNOHANG) == child_) status_ = status;
      continue;
    }
    // mpirun forwards what it is sent (SIGUSR1 asks every rank for its flight recorder); the
    // termination signals also mean the job is ending: the program's death is then a consequence.
    if (signal != SIGUSR1 && signal != SIGUSR2) stop(SteadyClock::now());
    kill(child_, signal);
  }
}

void Supervisor::stop(SteadyClock::time_point now) {
  stopped_ = true;
  if (!kill_at_) kill_at_ = now + kStopGrace;
}

void Supervisor::on_stderr() {
  std::string bytes;
  if (!read_some(stderr_.get(), bytes)) {
    stderr_.reset();
    return;
  }
  write_all(STDERR_FILENO, bytes);
  last_line_.feed(bytes);
}

void Supervisor::on_channel() {
  std::string bytes;
  if (!read_some(channel_.get(), bytes)) {
    channel_.reset();
    return;
  }
  for (const std::string& line : channel_lines_.feed(bytes)) {
    if (line + "\n" == kReachedTrainingLine && !reported_training_ && launcher_) {
      reported_training_ = true;
      write_all(launcher_.get(), encode_training());
    }
  }
}

void Supervisor::on_launcher() {
  std::string bytes;
  if (read_some(launcher_.get(), bytes)) {
    // dtrain-launch was interrupted: the program gets the signal itself and the time it needs to
    // stop (dtrain saves a checkpoint first); no SIGKILL from here, dtrain-launch bounds the wait.
    for (const std::string& line : launcher_lines_.feed(bytes)) {
      const std::optional<ChannelMessage> m = decode_message(line);
      if (m && m->kind == ChannelMessage::Kind::kStop && !status_) {
        stopped_ = true;
        kill(child_, m->signal);
      }
    }
    return;
  }
  // Closed: dtrain-launch ended or was killed, so nobody supervises this rank any more.
  launcher_.reset();
  stop(SteadyClock::now());
  kill(child_, SIGTERM);
}

void Supervisor::drain_stderr() {
  const auto until = SteadyClock::now() + kStderrDrain;
  while (stderr_) {
    const auto left = std::chrono::duration_cast<milliseconds>(until - SteadyClock::now()).count();
    pollfd p{stderr_.get(), POLLIN, 0};
    if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0) break;
    on_stderr();
  }
}

int Supervisor::poll_timeout_ms(SteadyClock::time_point now) const {
  if (!kill_at_) return -1;
  return static_cast<int>(std::max<int64_t>(0, std::chrono::duration_cast<milliseconds>(*kill_at_ - now).count() + 1));
}

}  // namespace

int run_rank_supervisor(const std::vector<std::string>& program) {
  if (program.empty()) {
    std::fprintf(stderr, "dtrain-launch --rank-supervisor: no program to run\n");
    return 2;
  }
  // mpirun (or its node daemon) gone: stop as if told to (SIGTERM arrives through the pipe).
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  const char* addresses = std::getenv(kLaunchAddressesEnv);
  const char* token = std::getenv(kLaunchTokenEnv);
  if (addresses == nullptr || token == nullptr) {
    // Not started by dtrain-launch: nothing to report to; be the program.
    std::vector<char*> argv;
    for (const std::string& word : program) argv.push_back(const_cast<char*>(word.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "dtrain-launch: cannot run %s: %s\n", argv[0], std::strerror(errno));
    return errno == ENOENT ? 127 : 126;
  }
  const int rank = rank_from_env();
  const std::string host = host_name();
  std::string error;
  Fd launcher = connect_first(parse_addresses(addresses), kConnectTimeout, error);
  if (!launcher) {
    std::fprintf(stderr,
                 "dtrain-launch: rank %d on %s cannot reach dtrain-launch at %s (%s); across nodes, --iface names a "
                 "network every node reaches\n",
                 rank, host.c_str(), addresses, error.c_str());
    return 1;
  }
  write_all(launcher.get(), encode_hello({token, rank, host, static_cast<long>(getpid())}));
  try {
    Supervisor supervisor(std::move(launcher), program);
    return supervisor.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain-launch: rank %d on %s: %s\n", rank, host.c_str(), e.what());
    return 1;
  }
}

}  // namespace dtrain::launcher
