// The local rank/size cross-check against launcher variables: agreement passes, unset
// variables are ignored, and a mismatch or garbage names the variable and both values.
#include "comm/local_topology.h"

#include <map>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"

namespace dtrain {
namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string error_of(int local_rank, int local_size, std::map<std::string, std::string> vars) {
  try {
    check_local_topology(local_rank, local_size, env_of(std::move(vars)));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(LocalTopology, NoVariablesSetPasses) { EXPECT_EQ(error_of(1, 2, {}), ""); }

TEST(LocalTopology, AgreeingVariablesPass) {
  EXPECT_EQ(error_of(1, 3,
                     {{"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                      {"SLURM_LOCALID", "1"},
                      {"LOCAL_RANK", "1"},
                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"},
                      {"LOCAL_WORLD_SIZE", "3"}}),
            "");
}

TEST(LocalTopology, EachRankVariableIsChecked) {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"}) {
    std::string msg = error_of(0, 2, {{name, "1"}});
    EXPECT_THAT(msg, ::testing::HasSubstr(std::string(name) + "=1")) << name;
    EXPECT_THAT(msg, ::testing::HasSubstr("gives local rank 0")) << name;
  }
}

TEST(LocalTopology, SizeVariablesAreChecked) {
  std::string msg = error_of(0, 2, {{"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  EXPECT_THAT(msg, ::testing::HasSubstr("OMPI_COMM_WORLD_LOCAL_SIZE=4"));
  EXPECT_THAT(msg, ::testing::HasSubstr("gives local size 2"));
  EXPECT_THAT(error_of(0, 2, {{"LOCAL_WORLD_SIZE", "1"}}), ::testing::HasSubstr("LOCAL_WORLD_SIZE=1"));
}

TEST(LocalTopology, OnlyTheLauncherThatStartedTheProcessIsChecked) {
  // mpirun inside a Slurm allocation: every rank inherits the batch step's SLURM_LOCALID=0.
  EXPECT_EQ(error_of(1, 2, {{"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"SLURM_LOCALID", "0"}, {"LOCAL_RANK", "0"}}), "");
  EXPECT_EQ(error_of(1, 2, {{"SLURM_LOCALID", "1"}, {"LOCAL_RANK", "0"}}), "");  // srun: Slurm's word counts
  EXPECT_THAT(error_of(2, 4, {{"LOCAL_RANK", "0"}}), ::testing::HasSubstr("LOCAL_RANK=0"));
}

TEST(LocalTopology, NonIntegerValuesAreErrors) {
  for (const char* bad : {"", "one", "1x", " 1", "-"}) {
    EXPECT_THAT(error_of(1, 2, {{"SLURM_LOCALID", bad}}), ::testing::HasSubstr("is not an integer")) << "'" << bad << "'";
  }
}

}  // namespace
}  // namespace dtrain
