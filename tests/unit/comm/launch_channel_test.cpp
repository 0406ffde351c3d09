// The rank side of dtrain-launch's launch channel: report_reached_training() writes its one line
// into the socket the environment names, once however often it is called, and nothing at all
// when the variable is missing, malformed or names something that is not a Unix-domain socket
// (a file, an MPI TCP connection). Each case runs
// in a child process (the report is once per process).
#include "comm/launch_channel.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
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

TEST(LaunchChannel, NeverWritesIntoATcpConnectionThatHappensToHaveTheNumber) {
  // Like an MPI rank's TCP connection to a peer: a loopback connection, accepted on the far end.
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(listen(listener, 1), 0);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const int near = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(near, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  const int far = accept(listener, nullptr, nullptr);
  ASSERT_GE(far, 0);
  EXPECT_TRUE(in_child([&] {
    setenv(dtrain::kLaunchChannelFdEnv, std::to_string(near).c_str(), 1);
    dtrain::report_reached_training();
  }));
  close(near);
  EXPECT_EQ(read_all(far), "");
  close(far);
  close(listener);
}

}  // namespace
