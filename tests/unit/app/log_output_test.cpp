// LogOutput: rank 0's log lines reach a pipe whole and in order, wait for a slow reader rather
// than lose a line, but give way to a stop signal when nobody reads (mpirun once it is
// signalled), without touching the flags of the stdout the process shares with its parent.
#include "app/log_output.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace dtrain {
namespace {

using namespace std::chrono_literals;

struct Pipe {
  int read = -1, write = -1;
  Pipe() {
    int fds[2];
    EXPECT_EQ(pipe(fds), 0);
    read = fds[0];
    write = fds[1];
  }
  ~Pipe() {
    close(read);
    close(write);
  }
  // Fills the pipe to the brim (through a non-blocking handle of our own).
  void fill() const {
    const int fd = open(("/proc/self/fd/" + std::to_string(write)).c_str(), O_WRONLY | O_NONBLOCK);
    ASSERT_GE(fd, 0);
    const std::string chunk(4096, 'x');
    while (::write(fd, chunk.data(), chunk.size()) > 0) {
    }
    const std::string byte(1, 'x');
    while (::write(fd, byte.data(), 1) > 0) {
    }
    close(fd);
  }
  std::string drain() const {
    std::string all;
    char buffer[65536];
    const int flags = fcntl(read, F_GETFL);
    fcntl(read, F_SETFL, flags | O_NONBLOCK);
    ssize_t n;
    while ((n = ::read(read, buffer, sizeof buffer)) > 0) all.append(buffer, static_cast<size_t>(n));
    fcntl(read, F_SETFL, flags);
    return all;
  }
};

TEST(LogOutput, LinesReachThePipeInOrder) {
  Pipe p;
  LogOutput out(p.write, [] { return false; });
  out.write("one\n");
  out.write("two\nthree\n");
  EXPECT_EQ(p.drain(), "one\ntwo\nthree\n");
  EXPECT_EQ(out.dropped_bytes(), 0);
}

TEST(LogOutput, LeavesTheSharedDescriptorBlocking) {
  Pipe p;
  LogOutput out(p.write, [] { return false; });
  out.write("line\n");
  EXPECT_EQ(fcntl(p.write, F_GETFL) & O_NONBLOCK, 0);
}

TEST(LogOutput, WaitsForASlowReaderAndLosesNothing) {
  Pipe p;
  p.fill();
  LogOutput out(p.write, [] { return false; });
  std::string read_back;
  std::thread reader([&] {
    std::this_thread::sleep_for(200ms);
    read_back = p.drain();  // room for the line
    std::this_thread::sleep_for(100ms);
    read_back += p.drain();
  });
  out.write("a line that must not be lost\n");
  reader.join();
  read_back += p.drain();
  EXPECT_NE(read_back.find("a line that must not be lost\n"), std::string::npos);
  EXPECT_EQ(out.dropped_bytes(), 0);
}

TEST(LogOutput, GivesWayToAStopWhenNobodyReads) {
  Pipe p;
  p.fill();
  std::atomic<bool> stopping{false};
  LogOutput out(p.write, [&] { return stopping.load(); });
  std::thread signal([&] {
    std::this_thread::sleep_for(100ms);
    stopping = true;  // as StopSignals' handler records SIGTERM
  });
  const auto t0 = std::chrono::steady_clock::now();
  out.write("Train Epoch: 1 [0/60000 (0%)] Loss: 2.302585\n");
  const auto waited = std::chrono::steady_clock::now() - t0;
  signal.join();
  EXPECT_LT(waited, 2s) << "a writer blocked on an unread pipe never reaches the stop";
  EXPECT_EQ(out.dropped_bytes(), 45);
  out.write("checkpoint: ckpt/step-38\n");  // after the stop: dropped at once
  EXPECT_EQ(out.dropped_bytes(), 45 + 25);
}

TEST(LogOutput, ARegularFileIsWrittenAsItIs) {
  char path[] = "/tmp/dtrain_log_output_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  {
    LogOutput out(fd, [] { return true; });
    out.write("kept even when stopping\n");
  }
  char buffer[64] = {};
  EXPECT_EQ(pread(fd, buffer, sizeof buffer - 1, 0), 24);
  EXPECT_STREQ(buffer, "kept even when stopping\n");
  close(fd);
  unlink(path);
}

}  // namespace
}  // namespace dtrain
