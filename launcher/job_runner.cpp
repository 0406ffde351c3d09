// One mpirun job under dtrain-launch's watch (see job_runner.h).
#include "launcher/job_runner.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <list>

#include <fmt/format.h>

namespace dtrain::launcher {

namespace {

struct Connection {
  Fd fd;
  LineSplitter lines;
  int rank = -1;  // -1 until its hello
};

// mpirun in its own process group, dying with dtrain-launch (parent-death signal).
pid_t start_mpirun(const std::vector<std::string>& argv) {
  std::fflush(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid != 0) return pid;
  setpgid(0, 0);
  restore_default_signals();
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) _exit(1);
  std::vector<char*> c_argv;
  for (const std::string& word : argv) c_argv.push_back(const_cast<char*>(word.c_str()));
  c_argv.push_back(nullptr);
  execvp(c_argv[0], c_argv.data());
  std::fprintf(stderr, "dtrain-launch: cannot run %s: %s\n", c_argv[0], std::strerror(errno));
  std::fflush(stderr);
  _exit(127);
}

int status_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

class JobRun {
 public:
  JobRun(const JobAttempt& a, Listener& listener, SignalPipe& signals)
      : a_(a), listener_(listener), signals_(signals), monitor_(a.np, a.timings, Clock::now()) {}
  JobOutcome run();

 private:
  void on_signals(Clock::time_point now);
  void stop_ranks();
  void on_accept();
  void on_connection(Connection& c, Clock::time_point now);
  void on_line(Connection& c, const std::string& line, Clock::time_point now);
  int poll_timeout_ms(Clock::time_point now) const;

  const JobAttempt& a_;
  Listener& listener_;
  SignalPipe& signals_;
  JobMonitor monitor_;
  pid_t mpirun_ = -1;
  bool mpirun_running_ = false;
  std::list<Connection> connections_;
};

JobOutcome JobRun::run() {
  mpirun_ = start_mpirun(a_.mpirun_argv);
  if (mpirun_ < 0) return {JobOutcome::Kind::kMpirunFailed, 127, fmt::format("cannot start mpirun: {}", std::strerror(errno))};
  mpirun_running_ = true;
  while (true) {
    std::vector<pollfd> polls{{signals_.fd(), POLLIN, 0}, {listener_.fd.get(), POLLIN, 0}};
    for (const Connection& c : connections_) polls.push_back({c.fd.get(), POLLIN, 0});
    const Clock::time_point before = Clock::now();
    if (poll(polls.data(), polls.size(), poll_timeout_ms(before)) < 0 && errno != EINTR)
      throw std::runtime_error(fmt::format("poll: {}", std::strerror(errno)));
    const Clock::time_point now = Clock::now();
    if (polls[0].revents) on_signals(now);
    if (polls[1].revents) on_accept();
    for (auto it = connections_.begin(); it != connections_.end();) {
      const auto found = std::find_if(polls.begin() + 2, polls.end(), [&](const pollfd& p) { return p.fd == it->fd.get(); });
      if (found != polls.end() && found->revents) on_connection(*it, now);
      it = it->fd ? std::next(it) : connections_.erase(it);
    }
    const JobMonitor::Action action = monitor_.poll(Clock::now());
    if (action == JobMonitor::Action::kStopRanks) stop_ranks();
    if (action == JobMonitor::Action::kTerminate && mpirun_running_) kill(mpirun_, SIGTERM);
    // SIGKILL to mpirun's process group (Open MPI puts each process it starts in a group of its
    // own, so this is mpirun: its supervisors follow by their parent-death signal, remote ones
    // when their daemons lose mpirun, and take their programs along within a second).
    if (action == JobMonitor::Action::kKill && mpirun_running_) kill(-mpirun_, SIGKILL);
    if (action == JobMonitor::Action::kFinish) break;
  }
  connections_.clear();  // any supervisor still connected stops its program
  return monitor_.outcome();
}

void JobRun::on_signals(Clock::time_point now) {
  for (int signal : signals_.take()) {
    if (signal == SIGCHLD) {
      int status = 0;
      if (mpirun_running_ && waitpid(mpirun_, &status, WNOHANG) == mpirun_) {
        mpirun_running_ = false;
        monitor_.mpirun_exited(status_code(status), now);
      }
    } else if (signal == SIGUSR1 || signal == SIGUSR2) {
      if (mpirun_running_) kill(mpirun_, signal);
    } else {
      monitor_.interrupted(signal, now);
    }
  }
}

// Every rank supervisor that said hello passes the signal to its program (Note [Ending a job]).
void JobRun::stop_ranks() {
  const std::string message = encode_stop(monitor_.stop_signal());
  for (const Connection& c : connections_)
    if (c.fd && c.rank >= 0) write_all(c.fd.get(), message);
}

void JobRun::on_accept() {
  const int fd = accept4(listener_.fd.get(), nullptr, nullptr, SOCK_CLOEXEC);
  if (fd >= 0) connections_.push_back({Fd(fd), {}, -1});
}

void JobRun::on_connection(Connection& c, Clock::time_point now) {
  std::string bytes;
  if (!read_some(c.fd.get(), bytes)) {
    if (c.rank >= 0) monitor_.supervisor_closed(c.rank, now);
    c.fd.reset();
    return;
  }
  for (const std::string& line : c.lines.feed(bytes)) on_line(c, line, now);
}

void JobRun::on_line(Connection& c, const std::string& line, Clock::time_point now) {
  const std::optional<ChannelMessage> m = decode_message(line);
  if (!m || (c.rank < 0 && m->kind != ChannelMessage::Kind::kHello)) {
    c.fd.reset();  // not one of ours
    return;
  }
  switch (m->kind) {
    case ChannelMessage::Kind::kHello:
      if (m->hello.token != a_.token || c.rank >= 0 || m->hello.rank >= a_.np) {
        c.fd.reset();  // another job's or another attempt's supervisor, or a stranger
        return;
      }
      c.rank = m->hello.rank;
      monitor_.hello(c.rank, m->hello.host, now);
      break;
    case ChannelMessage::Kind::kTraining: monitor_.reached_training(c.rank, now); break;
    case ChannelMessage::Kind::kExit: {
      RankExit e = m->exit;
      e.rank = c.rank;
      monitor_.rank_exit(std::move(e), now);
      break;
    }
    case ChannelMessage::Kind::kStop: break;  // dtrain-launch's own message: a supervisor never sends it
  }
}

int JobRun::poll_timeout_ms(Clock::time_point now) const {
  const Clock::time_point next = monitor_.next_deadline();
  if (next == Clock::time_point::max()) return -1;
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1;
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 60'000));
}

}  // namespace

JobOutcome run_job_attempt(const JobAttempt& attempt, Listener& listener, SignalPipe& signals) {
  return JobRun(attempt, listener, signals).run();
}

}  // namespace dtrain::launcher
