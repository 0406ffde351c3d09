// The rank side of dtrain-launch's launch channel: report_reached_training() writes its one line
// into the socket the environment names, once however often it is called, and nothing at all
// when the variable is missing, malformed or names something that is not a socket. Each case runs
// in a child process (the report is once per process).
#include "comm/launch_channel.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <string>

#include <gtest/gtest.h>

namespace {

// Runs `body` in a child process; true when it exited 0.
bool in_child(const std::function<void()>& body) {
  const pid_t pid = fork();
  if (pid == 0) {
    body();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

std::string read_all(int fd) {
  std::string text;
  char buffer[256];
  for (ssize_t n; (n = read(fd, buffer, sizeof buffer)) > 0;) text.append(buffer, static_cast<size_t>(n));
  return text;
}

TEST(LaunchChannel, ReportsReachingTrainingOnce) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  EXPECT_TRUE(in_child([&] {
    close(fds[0]);
    setenv(dtrain::kLaunchChannelFdEnv, std::to_string(fds[1]).c_str(), 1);
    dtrain::report_reached_training();
    dtrain::report_reached_training();
  }));
  close(fds[1]);
  EXPECT_EQ(read_all(fds[0]), dtrain::kReachedTrainingLine);
  close(fds[0]);
}

TEST(LaunchChannel, NothingWithoutAChannel) {
  EXPECT_TRUE(in_child([] {
    unsetenv(dtrain::kLaunchChannelFdEnv);
    dtrain::report_reached_training();
  }));
  for (const char* bad : {"", "x", "-1", "999999", "3 "}) {
    EXPECT_TRUE(in_child([&] {
      setenv(dtrain::kLaunchChannelFdEnv, bad, 1);
      dtrain::report_reached_training();
    })) << bad;
  }
}

TEST(LaunchChannel, NeverWritesIntoAFileThatHappensToHaveTheNumber) {
  char path[] = "/tmp/dtrain_launch_channel_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(in_child([&] {
    setenv(dtrain::kLaunchChannelFdEnv, std::to_string(fd).c_str(), 1);
    dtrain::report_reached_training();
  }));
  lseek(fd, 0, SEEK_SET);
  EXPECT_EQ(read_all(fd), "");
  close(fd);
  unlink(path);
}

}  // namespace
