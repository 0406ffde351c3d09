#include "app/log_output.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "app/preemption.h"
#include "core/error.h"

namespace dtrain {

namespace {

constexpr int kPollMs = 20;  // how often a writer waiting for the reader looks for a stop signal

}  // namespace

LogOutput::LogOutput(int fd) : LogOutput(fd, [] { return StopSignals::received() != 0; }) {}

LogOutput::LogOutput(int fd, std::function<bool()> stopping) : fd_(fd), stopping_(std::move(stopping)) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || S_ISREG(st.st_mode)) {
    wait_ = false;  // a file never waits for a reader
    return;
  }
  // A new open file description of the same pipe or terminal: O_NONBLOCK on it leaves the one
  // this process shares with its parent (a shell's terminal) as it was.
  own_fd_ = open(fmt::format("/proc/self/fd/{}", fd).c_str(), O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (own_fd_ >= 0) {
    fd_ = own_fd_;
    wait_ = false;
  }
  // Otherwise (a socket cannot be reopened): poll for room before each write, which bounds the
  // wait for a line that fits in what the reader left free.
}

LogOutput::~LogOutput() {
  if (own_fd_ >= 0) close(own_fd_);
}

void LogOutput::write(std::string_view text) {
  while (!text.empty()) {
    if (wait_) {
      pollfd p{fd_, POLLOUT, 0};
      if (poll(&p, 1, kPollMs) <= 0) {
        if (!stopping_()) continue;
        dropped_ += static_cast<int64_t>(text.size());
        return;
      }
    }
    const ssize_t n = ::write(fd_, text.data(), text.size());
    if (n > 0) {
      text.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    const int error = errno;
    if (stopping_()) {  // the job is ending: the log gives way, whatever the reason
      dropped_ += static_cast<int64_t>(text.size());
      return;
    }
    if (n < 0 && (error == EAGAIN || error == EWOULDBLOCK)) {
      pollfd p{fd_, POLLOUT, 0};
      poll(&p, 1, kPollMs);
      continue;
    }
    throw Error(fmt::format("cannot write the log to stdout: {}", n < 0 ? std::strerror(error) : "nothing written"));
  }
}

}  // namespace dtrain
