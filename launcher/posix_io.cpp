// File descriptors, signals as bytes, and TCP helpers for dtrain-launch (see posix_io.h).
#include "launcher/posix_io.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain::launcher {

namespace {

int g_signal_write_fd = -1;  // the one SignalPipe's write end, for the handler

constexpr int kCaughtSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCHLD, SIGPIPE};

void on_signal(int signal) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(signal);
  [[maybe_unused]] ssize_t n = write(g_signal_write_fd, &byte, 1);  // full pipe: the signal is already pending there
  errno = saved;
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

void Fd::reset(int fd) {
  if (fd_ >= 0) close(fd_);
  fd_ = fd;
}

SignalPipe::SignalPipe(std::initializer_list<int> signals) : signals_(signals) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) throw Error("cannot create a pipe: " + errno_text());
  read_.reset(fds[0]);
  write_.reset(fds[1]);
  g_signal_write_fd = write_.get();
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int s : signals_) sigaction(s, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a closed socket or pipe is an error return, never a death
}

SignalPipe::~SignalPipe() {
  restore_default_signals();
  g_signal_write_fd = -1;
}

std::vector<int> SignalPipe::take() {
  std::vector<int> delivered;
  unsigned char bytes[64];
  ssize_t n = 0;
  while ((n = read(read_.get(), bytes, sizeof bytes)) > 0) delivered.insert(delivered.end(), bytes, bytes + n);
  return delivered;
}

void restore_default_signals() {
  for (int s : kCaughtSignals) signal(s, SIG_DFL);
}

Listener listen_tcp(bool loopback_only) {
  Fd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) throw Error("cannot create a socket: " + errno_text());
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(loopback_only ? INADDR_LOOPBACK : INADDR_ANY);
  address.sin_port = 0;
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 || listen(fd.get(), 1024) != 0)
    throw Error("cannot listen for rank supervisors on a TCP port: " + errno_text());
  socklen_t length = sizeof address;
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&address), &length);
  return {std::move(fd), ntohs(address.sin_port)};
}

Fd connect_first(const std::vector<TcpAddress>& addresses, std::chrono::milliseconds timeout, std::string& error) {
  std::vector<Fd> pending;
  std::vector<pollfd> polls;
  error = addresses.empty() ? "no address given" : "";
  for (const TcpAddress& a : addresses) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(a.port));
    if (inet_pton(AF_INET, a.ipv4.c_str(), &address.sin_addr) != 1) continue;
    Fd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) continue;
    if (connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 && errno != EINPROGRESS) {
      error = fmt::format("{}:{}: {}", a.ipv4, a.port, errno_text());
      continue;
    }
    polls.push_back({fd.get(), POLLOUT, 0});
    pending.push_back(std::move(fd));
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pending.empty()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      error = fmt::format("no answer within {} ms", timeout.count());
      break;
    }
    if (poll(polls.data(), polls.size(), static_cast<int>(left.count())) < 0 && errno != EINTR) break;
    for (size_t i = 0; i < polls.size(); ++i) {
      if (polls[i].revents == 0) continue;
      int so_error = 0;
      socklen_t length = sizeof so_error;
      getsockopt(pending[i].get(), SOL_SOCKET, SO_ERROR, &so_error, &length);
      if (so_error == 0) {
        const int flags = fcntl(pending[i].get(), F_GETFL);
        fcntl(pending[i].get(), F_SETFL, flags & ~O_NONBLOCK);
        return std::move(pending[i]);
      }
      error = std::strerror(so_error);
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      polls.erase(polls.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  }
  return Fd();
}

bool write_all(int fd, std::string_view bytes) {
  struct stat st {};
  const bool is_socket = fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode);
  while (!bytes.empty()) {
    const ssize_t n = is_socket ? send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) : write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

bool read_some(int fd, std::string& out) {
  char buffer[8192];
  ssize_t n = 0;
  do {
    n = read(fd, buffer, sizeof buffer);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) {
    out.clear();
    return false;
  }
  out.assign(buffer, static_cast<size_t>(n));
  return true;
}

}  // namespace dtrain::launcher
