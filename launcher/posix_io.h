// The few POSIX pieces dtrain-launch and its rank supervisors share: an owning file descriptor,
// signals delivered as readable bytes (a self-pipe, so one poll() loop waits for everything),
// a TCP listener on an ephemeral port, a connect that tries several addresses at once, and
// writes that neither stop half-way nor raise SIGPIPE.
#pragma once

#include <chrono>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "launcher/channel_protocol.h"

namespace dtrain::launcher {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Catches `signals` for the life of this object (one at a time per process); each delivery
// becomes one byte on fd(). SIGPIPE is ignored meanwhile. The destructor restores the defaults.
class SignalPipe {
 public:
  explicit SignalPipe(std::initializer_list<int> signals);
  ~SignalPipe();
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;
  int fd() const { return read_.get(); }
  std::vector<int> take();  // the signals delivered since the last call, in order

 private:
  Fd read_, write_;
  std::vector<int> signals_;
};

// Puts back the default action of every signal a SignalPipe catches or ignores: for a child
// between fork and exec.
void restore_default_signals();

// A TCP socket listening on every IPv4 address (`loopback_only`: 127.0.0.1), port chosen by the
// kernel. Throws dtrain::Error when it cannot.
struct Listener {
  Fd fd;
  int port = 0;
};
Listener listen_tcp(bool loopback_only);

// Connects to the first of `addresses` that answers within `timeout` (all tried at once).
// Returns an invalid Fd and sets `error` when none does.
Fd connect_first(const std::vector<TcpAddress>& addresses, std::chrono::milliseconds timeout, std::string& error);

// Writes all of `bytes` (retrying after EINTR and short writes; MSG_NOSIGNAL on sockets).
// False on any error.
bool write_all(int fd, std::string_view bytes);

// One read() (retried after EINTR) into `out`, replacing its contents: false at end of file or
// on an error. Call it when poll() says fd is readable.
bool read_some(int fd, std::string& out);

}  // namespace dtrain::launcher
