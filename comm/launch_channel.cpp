// The rank side of the launch channel (see launch_channel.h).
#include "comm/launch_channel.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>

namespace dtrain {

namespace {

// The channel's descriptor, or -1 when this process has none: the variable is unset or
// malformed, or names a descriptor that is not a Unix-domain socket (an inherited variable must
// never make us write into a file, a terminal or an MPI peer's TCP connection that happens to
// have that number; the launcher's channel is always a socketpair).
int channel_fd() {
  const char* text = std::getenv(kLaunchChannelFdEnv);
  if (text == nullptr) return -1;
  int fd = -1;
  const char* end = text + std::strlen(text);
  auto [ptr, ec] = std::from_chars(text, end, fd);
  if (ec != std::errc() || ptr != end || fd < 0) return -1;
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return -1;
  int domain = 0;
  socklen_t length = sizeof domain;
  if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &length) != 0 || domain != AF_UNIX) return -1;
  return fd;
}

}  // namespace

void report_reached_training() {
  static std::atomic<bool> reported{false};
  if (reported.exchange(true)) return;
  const int fd = channel_fd();
  if (fd < 0) return;
  ssize_t written = 0;
  do {
    // MSG_NOSIGNAL: a supervisor that is gone must not kill training with SIGPIPE.
    written = send(fd, kReachedTrainingLine.data(), kReachedTrainingLine.size(), MSG_NOSIGNAL);
  } while (written < 0 && errno == EINTR);
  // A failed send is no reason to fail training. The socket stays open: closing it would let
  // another socket reuse the number the environment still names.
}

}  // namespace dtrain
