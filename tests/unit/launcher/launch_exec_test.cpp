// dtrain-launch as a user runs it: exit 2 and one line for bad flags, the quoted command for
// --dry-run, and mpirun's exit status passed through (0 when all ranks succeed, non-zero when
// one fails while the others would still be running).
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace {

const std::string kLaunch = std::string(DTRAIN_BINARY_DIR) + "/launcher/dtrain-launch";

struct Result {
  int status = -1;
  std::string out;  // stdout and stderr
};

Result run(const std::string& args) {
  Result r;
  FILE* p = popen((kLaunch + " " + args + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) r.out.append(buf, n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

class LaunchExec : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kLaunch)) GTEST_SKIP() << kLaunch << " is not built";
  }
};

TEST_F(LaunchExec, BadFlagIsOneLineAndExitTwo) {
  Result r = run("-n 2 --no-such-flag -- true");
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.out, ::testing::StartsWith("dtrain-launch: "));
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
}

TEST_F(LaunchExec, DryRunPrintsTheCommandOnly) {
  Result r = run("-n 2 --dry-run -- prog 'a b'");
  EXPECT_EQ(r.status, 0);
  EXPECT_THAT(r.out, ::testing::StartsWith("mpirun -np 2 "));
  EXPECT_THAT(r.out, ::testing::EndsWith(" prog 'a b'\n"));
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
}

TEST_F(LaunchExec, SuccessfulRanksExitZero) {
  Result r = run("-n 2 -- true");
  EXPECT_EQ(r.status, 0) << r.out;
}

TEST_F(LaunchExec, FailingRankFailsTheJobAndTheOthersDoNotHang) {
  // Rank 1 exits 3 at once; rank 0 would sleep far past the test timeout unless mpirun kills it.
  Result r = run("-n 2 -- sh -c 'if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then exit 3; fi; exec sleep 1000'");
  EXPECT_EQ(r.status, 3) << r.out;
}

TEST_F(LaunchExec, MissingMpirunIsAnError) {
  Result r = run("-n 1 --mpirun /nonexistent/mpirun -- true");
  EXPECT_EQ(r.status, 127);
  EXPECT_THAT(r.out, ::testing::HasSubstr("cannot run /nonexistent/mpirun"));
}

}  // namespace
