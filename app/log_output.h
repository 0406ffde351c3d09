// LogOutput: rank 0's log lines on stdout, written so that a reader who stops reading cannot hold
// up a stop. mpirun (Open MPI 4.1), once signalled, no longer reads its ranks' output (measured:
// a rank printing to it blocks in write() for good), yet the ranks' SIGTERM comes only a second
// later: a rank 0 blocked in its log would never reach the stop vote and its checkpoint. So the
// lines go through a non-blocking handle of stdout's pipe or terminal: while the reader is slow,
// write() waits for it (no line is lost; a slow reader slows training, as a blocking stdout did)
// but looks every 20 ms whether a stop signal has come (app/preemption.h); after one, what cannot
// be written at once is dropped. A regular file (or /dev/null) is written as it is.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

namespace dtrain {

class LogOutput {
 public:
  // `fd`: where the lines go (not owned); `stopping`: whether to stop waiting for the reader
  // (default: a stop signal was received).
  explicit LogOutput(int fd);
  LogOutput(int fd, std::function<bool()> stopping);
  ~LogOutput();
  LogOutput(const LogOutput&) = delete;
  LogOutput& operator=(const LogOutput&) = delete;

  // All of `text`, unless stopping; throws dtrain::Error when the output fails otherwise.
  void write(std::string_view text);
  // Bytes given up on because the reader did not read after a stop signal.
  int64_t dropped_bytes() const { return dropped_; }

 private:
  int fd_;            // where write() writes: the non-blocking handle, or `fd` itself
  int own_fd_ = -1;   // the non-blocking handle when one was opened
  bool wait_ = true;  // poll before writing (a pipe or terminal not reopened non-blocking)
  std::function<bool()> stopping_;
  int64_t dropped_ = 0;
};

}  // namespace dtrain
