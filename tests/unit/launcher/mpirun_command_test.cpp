// The mpirun command for several option sets and machines: rank count, hosts, mapping and
// binding (one rank per GPU or core), oversubscription, root, environment forwarding and
// threads per rank. Pure: nothing is started.
#include "launcher/mpirun_command.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"

namespace dtrain::launcher {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

LaunchOptions opts(std::vector<std::string> args) { return parse_launch_args(args); }

LaunchHost machine(int cores, bool root = false, std::map<std::string, std::string> env = {}) {
  return LaunchHost{cores, root, std::move(env)};
}

std::string command(const std::vector<std::string>& args, const LaunchHost& host) {
  return shell_join(build_mpirun_argv(opts(args), host));
}

TEST(MpirunCommand, TwoRanksOnTwoCores) {
  EXPECT_THAT(build_mpirun_argv(opts({"-n", "2", "--", "dtrain", "train", "--epochs", "1"}), machine(2)),
              ElementsAre("mpirun", "-np", "2", "--map-by", "core", "--bind-to", "core", "--mca",
                          "orte_execute_quiet", "1", "-x",
                          "OPENBLAS_NUM_THREADS=1", "dtrain", "train", "--epochs", "1"));
}

TEST(MpirunCommand, OpenMpiBannersHiddenUnlessMpiVerbose) {
  EXPECT_THAT(command({"-n", "2", "--", "p"}, machine(2)), ::testing::HasSubstr("--mca orte_execute_quiet 1"));
  EXPECT_THAT(command({"-n", "2", "--mpi-verbose", "--", "p"}, machine(2)),
              Not(::testing::HasSubstr("orte_execute_quiet")));
}

TEST(MpirunCommand, MoreRanksThanCoresOversubscribesWithoutBinding) {
  EXPECT_EQ(command({"-n", "3", "--", "p"}, machine(2)),
            "mpirun -np 3 --bind-to none --oversubscribe --mca orte_execute_quiet 1 -x OPENBLAS_NUM_THREADS=1 p");
}

TEST(MpirunCommand, SpareCoresGoToEachRanksThreads) {
  // 16 cores, 4 ranks: 4 BLAS threads per rank, each rank bound to its own 4 cores.
  EXPECT_EQ(command({"-n", "4", "--", "p"}, machine(16)),
            "mpirun -np 4 --map-by slot:PE=4 --bind-to core --mca orte_execute_quiet 1 -x OPENBLAS_NUM_THREADS=4 p");
  EXPECT_EQ(command({"-n", "3", "--", "p"}, machine(8)),
            "mpirun -np 3 --map-by slot:PE=2 --bind-to core --mca orte_execute_quiet 1 -x OPENBLAS_NUM_THREADS=2 p");
}

TEST(MpirunCommand, OneRankPerGpu) {
  EXPECT_EQ(command({"-n", "2", "--gpus-per-node", "2", "--", "p"}, machine(16)),
            "mpirun -np 2 --map-by ppr:2:node:PE=8 --bind-to core --mca orte_execute_quiet 1 -x OPENBLAS_NUM_THREADS=8 p");
  EXPECT_EQ(command({"-n", "8", "--gpus-per-node", "8", "--", "p"}, machine(4)),
            "mpirun -np 8 --map-by ppr:8:node --bind-to none --oversubscribe --mca orte_execute_quiet 1 -x OPENBLAS_NUM_THREADS=1 p");
}

TEST(MpirunCommand, HostsAcrossNodes) {
  // Ranks per node come from the slots, not -n: no oversubscription across 2 nodes.
  EXPECT_EQ(command({"-n", "4", "--hosts", "h1:2,h2:2", "--", "p"}, machine(2)),
            "mpirun -np 4 --host h1:2,h2:2 --map-by core --bind-to core --mca orte_execute_quiet 1 -x OPENBLAS_NUM_THREADS=1 p");
  EXPECT_EQ(command({"-n", "8", "--hosts", "h1:4,h2:4", "--gpus-per-node", "4", "--", "p"}, machine(32)),
            "mpirun -np 8 --host h1:4,h2:4 --map-by ppr:4:node:PE=8 --bind-to core --mca orte_execute_quiet 1 -x OPENBLAS_NUM_THREADS=8 p");
}

TEST(MpirunCommand, OneHostIsASingleNode) {
  EXPECT_THAT(command({"-n", "4", "--hosts", "localhost:4", "--", "p"}, machine(2)), HasSubstr("--oversubscribe"));
}

TEST(MpirunCommand, Hostfile) {
  LaunchOptions o = opts({"-n", "6", "--hostfile", "/etc/hosts.mpi", "--", "p"});
  o.hosts = {{"a", 0}, {"b", 0}, {"c", 0}};  // what load_hostfile would read: slots unstated
  EXPECT_EQ(shell_join(build_mpirun_argv(o, machine(4))),
            "mpirun -np 6 --hostfile /etc/hosts.mpi --map-by slot:PE=2 --bind-to core --mca orte_execute_quiet 1 -x OPENBLAS_NUM_THREADS=2 p");
}

TEST(MpirunCommand, PlanForHosts) {
  LaunchOptions o = opts({"-n", "3", "--hosts", "a:4,b:4", "--", "p"});
  LaunchPlan plan = plan_launch(o, machine(8));
  EXPECT_FALSE(plan.single_node);
  EXPECT_EQ(plan.ranks_per_node, 3);  // mpirun fills a's 4 slots first
  EXPECT_EQ(plan.threads_per_rank, 2);
  EXPECT_TRUE(plan.bind_to_core);
  EXPECT_FALSE(plan.oversubscribe);
}

TEST(MpirunCommand, TooFewGpusIsAUsageError) {
  EXPECT_THROW(build_mpirun_argv(opts({"-n", "3", "--gpus-per-node", "2", "--", "p"}), machine(8)), UsageError);
  EXPECT_THROW(build_mpirun_argv(opts({"-n", "5", "--hosts", "a:2,b:2", "--gpus-per-node", "2", "--", "p"}), machine(8)),
               UsageError);
}

TEST(MpirunCommand, RootNeedsTheFlag) {
  EXPECT_THAT(build_mpirun_argv(opts({"-n", "2", "--", "p"}), machine(2, true)), Contains("--allow-run-as-root"));
  EXPECT_THAT(build_mpirun_argv(opts({"-n", "2", "--", "p"}), machine(2, false)), Not(Contains("--allow-run-as-root")));
}

TEST(MpirunCommand, ForwardsTheVariablesRanksNeedByName) {
  LaunchHost host = machine(2, false,
                            {{"CUDA_VISIBLE_DEVICES", "0,1"},
                             {"NCCL_DEBUG", "INFO"},
                             {"DTRAIN_TRACE", "1"},
                             {"OMP_NUM_THREADS", "3"},
                             {"HOME", "/root"},
                             {"OMPI_MCA_btl", "tcp,self"},
                             {"MY_NCCL_THING", "x"}});
  EXPECT_EQ(command({"-n", "2", "--", "p"}, host),
            "mpirun -np 2 --map-by core --bind-to core --mca orte_execute_quiet 1 -x CUDA_VISIBLE_DEVICES -x DTRAIN_TRACE -x NCCL_DEBUG "
            "-x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS=1 p");
}

TEST(MpirunCommand, UsersOpenblasThreadsWin) {
  EXPECT_EQ(command({"-n", "2", "--", "p"}, machine(16, false, {{"OPENBLAS_NUM_THREADS", "3"}})),
            "mpirun -np 2 --map-by slot:PE=8 --bind-to core --mca orte_execute_quiet 1 -x OPENBLAS_NUM_THREADS p");
}

TEST(MpirunCommand, CustomMpirun) {
  EXPECT_EQ(build_mpirun_argv(opts({"-n", "1", "--mpirun", "/opt/bin/mpirun", "--", "p"}), machine(1)).front(),
            "/opt/bin/mpirun");
}

TEST(MpirunCommand, ShellQuoting) {
  EXPECT_EQ(shell_quote("plain-word_1.0/x=y:z,@%+"), "plain-word_1.0/x=y:z,@%+");
  EXPECT_EQ(shell_quote(""), "''");
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote("$HOME;rm"), "'$HOME;rm'");
  EXPECT_EQ(shell_join({"echo", "a b", "c"}), "echo 'a b' c");
}

}  // namespace
}  // namespace dtrain::launcher
