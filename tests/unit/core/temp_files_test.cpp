// Temporaries of atomic writes: their names, and the clean-up of a dead writer's (issue 19,
// item 15) that never touches a live one's.
#include "core/temp_files.h"

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "../data/temp_dir.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;

// The pid of a process that has exited and been reaped.
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

TEST(TempFiles, NamesCarryTheWritersPid) {
  EXPECT_EQ(temporary_path("d/trace.json"), "d/trace.json.tmp" + std::to_string(::getpid()));
  EXPECT_EQ(temporary_owner("trace.json.tmp123", "trace.json"), 123);
  for (const char* other : {"trace.json", "trace.json.tmp", "trace.json.tmp12x", "trace.json.tmp-12", "trace.json.tmp012",
                            "trace.json.tmp+1", "trace.jsonx.tmp12", "xtrace.json.tmp12", "trace.json.tmp99999999999999"})
    EXPECT_EQ(temporary_owner(other, "trace.json"), std::nullopt) << other;
  // rank1's file is not rank10's.
  EXPECT_EQ(temporary_owner("flight_recorder_rank10.json.tmp5", "flight_recorder_rank1.json"), std::nullopt);
}

TEST(TempFiles, RemovesADeadWritersTemporaryAndNeverALiveOnes) {
  dtrain::testing::TempDir tmp;
  const std::string target = tmp.file("flight_recorder_rank1.json");
  const std::string dead = target + ".tmp" + std::to_string(dead_pid());
  const std::string live_parent = target + ".tmp" + std::to_string(::getppid());
  const std::string mine = temporary_path(target);
  const std::string other_file = tmp.file("flight_recorder_rank10.json.tmp" + std::to_string(dead_pid()));
  for (const std::string& path : {dead, live_parent, mine, other_file}) std::ofstream(path) << "{";
  EXPECT_FALSE(process_alive(std::stoi(dead.substr(dead.rfind("tmp") + 3))));
  EXPECT_EQ(remove_stale_temporaries(target), 1);
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(live_parent));
  EXPECT_TRUE(fs::exists(mine));
  EXPECT_TRUE(fs::exists(other_file));
  EXPECT_EQ(remove_stale_temporaries(tmp.file("absent/x.json")), 0);  // no directory: nothing to do
}

}  // namespace
}  // namespace dtrain
