// Slurm sanity: under srun (a job step) the MPI world must have the step's task count, or MPI
// was started without Slurm's PMI and every task is a job of its own: one clear line. A lone
// process in an sbatch script (a batch step has no SLURM_STEP_NUM_TASKS) and ranks that mpirun
// started (their Slurm step is mpirun's daemons') are never flagged.
#include <map>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "comm/mpi_lifecycle.h"

namespace dtrain {
namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

// What srun exports to each task of a 4-task step (the batch script's own variables included).
const std::map<std::string, std::string> kSrunStep = {{"SLURM_JOB_ID", "77"},         {"SLURM_STEP_ID", "0"},
                                                      {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_NTASKS", "4"},
                                                      {"SLURM_PROCID", "2"},         {"SLURM_JOB_NODELIST", "n[1-2]"}};

std::map<std::string, std::string> srun_step_with(std::map<std::string, std::string> changes) {
  changes.insert(kSrunStep.begin(), kSrunStep.end());  // keeps the changed values
  return changes;
}

TEST(LauncherWorld, SrunWithoutPmiIsOneClearError) {
  const std::string problem = launcher_world_mismatch(env_of(kSrunStep), 1);
  EXPECT_EQ(problem,
            "this is task 2 of the 4 that the launcher started (SLURM_STEP_NUM_TASKS=4), but MPI sees a world of 1 "
            "rank: MPI was not started through the launcher's PMI, so every task runs alone; under srun use --mpi=pmix "
            "(srun --mpi=list shows what the cluster offers), or start the job with dtrain-launch");
  EXPECT_THAT(launcher_world_mismatch(env_of(kSrunStep), 2), ::testing::HasSubstr("a world of 2 ranks"));
}

TEST(LauncherWorld, SrunWithAMatchingWorldIsFine) { EXPECT_EQ(launcher_world_mismatch(env_of(kSrunStep), 4), ""); }

TEST(LauncherWorld, ALoneProcessInAnSbatchScriptIsFine) {
  // The batch step: the allocation's variables, no SLURM_STEP_NUM_TASKS (sbatch(1), OUTPUT ENVIRONMENT VARIABLES).
  EXPECT_EQ(launcher_world_mismatch(env_of({{"SLURM_JOB_ID", "77"}, {"SLURM_NTASKS", "4"}, {"SLURM_PROCID", "0"},
                                            {"SLURM_JOB_NODELIST", "n[1-2]"}, {"SLURM_TASKS_PER_NODE", "2(x2)"}}),
                                    1),
            "");
  EXPECT_EQ(launcher_world_mismatch(env_of({}), 1), "");
}

TEST(LauncherWorld, MpirunInsideSlurmIsNotComparedWithItsDaemonsStep) {
  // mpirun starts its daemons with srun (one task per node); its ranks inherit that step.
  const auto vars = srun_step_with({{"SLURM_STEP_NUM_TASKS", "2"}, {"OMPI_COMM_WORLD_SIZE", "8"}});
  EXPECT_EQ(launcher_world_mismatch(env_of(vars), 8), "");
}

TEST(LauncherWorld, APmiServersCountIsTheOneToMatch) {
  // MPICH's hydra under Slurm: one proxy per node in the step, the ranks counted by its PMI.
  const auto vars = srun_step_with({{"SLURM_STEP_NUM_TASKS", "2"}, {"PMI_SIZE", "8"}});
  EXPECT_EQ(launcher_world_mismatch(env_of(vars), 8), "");
  EXPECT_THAT(launcher_world_mismatch(env_of(vars), 1), ::testing::HasSubstr("(PMI_SIZE=8)"));
}

TEST(LauncherWorld, UnreadableCountsAreNotGuessedAt) {
  EXPECT_EQ(launcher_world_mismatch(env_of(srun_step_with({{"SLURM_STEP_NUM_TASKS", "four"}})), 1), "");
}

}  // namespace
}  // namespace dtrain
