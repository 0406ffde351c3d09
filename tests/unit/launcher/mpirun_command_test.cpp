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
  LaunchHost host;
  host.cores = cores;
  host.is_root = root;
  host.env = std::move(env);
  return host;
}

std::string command(const std::vector<std::string>& args, const LaunchHost& host) {
  return shell_join(build_mpirun_argv(resolve_launch(opts(args), host), host));
}

std::string resolve_error(const LaunchOptions& o, const LaunchHost& host) {
  try {
    resolve_launch(o, host);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

const std::map<std::string, std::string> kSlurmTwoByTwo = {{"SLURM_JOB_NODELIST", "node[01-02]"},
                                                           {"SLURM_TASKS_PER_NODE", "2(x2)"}};

TEST(MpirunCommand, RankSupervisorAndItsSettingsComeJustBeforeTheProgram) {
  LaunchOptions o = opts({"-n", "2", "--", "dtrain", "train"});
  o.rank_supervisor = {"/opt/bin/dtrain-launch", "--rank-supervisor", "--"};
  o.rank_env = {"DTRAIN_LAUNCH_TOKEN=t-0"};
  EXPECT_THAT(build_mpirun_argv(o, machine(2)),
              ElementsAre("mpirun", "-np", "2", "--map-by", "core", "--bind-to", "core", "--mca", "orte_execute_quiet",
                          "1", "-x", "OPENBLAS_NUM_THREADS=1", "-x", "DTRAIN_STDOUT_IS_TTY=0", "-x", "DTRAIN_LAUNCH_TOKEN=t-0",
                          "/opt/bin/dtrain-launch",
                          "--rank-supervisor", "--", "dtrain", "train"));
}

TEST(MpirunCommand, TwoRanksOnTwoCores) {
  EXPECT_THAT(build_mpirun_argv(opts({"-n", "2", "--", "dtrain", "train", "--epochs", "1"}), machine(2)),
              ElementsAre("mpirun", "-np", "2", "--map-by", "core", "--bind-to", "core", "--mca",
                          "orte_execute_quiet", "1", "-x",
                          "OPENBLAS_NUM_THREADS=1", "-x", "DTRAIN_STDOUT_IS_TTY=0", "dtrain", "train", "--epochs", "1"));
}

TEST(MpirunCommand, OpenMpiBannersHiddenUnlessMpiVerbose) {
  EXPECT_THAT(command({"-n", "2", "--", "p"}, machine(2)), ::testing::HasSubstr("--mca orte_execute_quiet 1"));
  EXPECT_THAT(command({"-n", "2", "--mpi-verbose", "--", "p"}, machine(2)),
              Not(::testing::HasSubstr("orte_execute_quiet")));
}

TEST(MpirunCommand, MoreRanksThanCoresOversubscribesWithoutBinding) {
  EXPECT_EQ(command({"-n", "3", "--", "p"}, machine(2)),
            "mpirun -np 3 --bind-to none --oversubscribe --mca orte_execute_quiet 1 -x OPENBLAS_NUM_THREADS=1 -x DTRAIN_STDOUT_IS_TTY=0 p");
}

TEST(MpirunCommand, SpareCoresGoToEachRanksThreads) {
  // 16 cores, 4 ranks: 4 BLAS threads per rank, each rank bound to its own 4 cores.
  EXPECT_EQ(command({"-n", "4", "--", "p"}, machine(16)),
            "mpirun -np 4 --map-by slot:PE=4 --bind-to core --mca orte_execute_quiet 1 -x OPENBLAS_NUM_THREADS=4 -x DTRAIN_STDOUT_IS_TTY=0 p");
  EXPECT_EQ(command({"-n", "3", "--", "p"}, machine(8)),
            "mpirun -np 3 --map-by slot:PE=2 --bind-to core --mca orte_execute_quiet 1 -x OPENBLAS_NUM_THREADS=2 -x DTRAIN_STDOUT_IS_TTY=0 p");
}

TEST(MpirunCommand, OneRankPerGpu) {
  EXPECT_EQ(command({"-n", "2", "--gpus-per-node", "2", "--", "p"}, machine(16)),
            "mpirun -np 2 --map-by ppr:2:node:PE=8 --bind-to core --mca orte_execute_quiet 1 -x OPENBLAS_NUM_THREADS=8 -x DTRAIN_STDOUT_IS_TTY=0 p");
  EXPECT_EQ(command({"-n", "8", "--gpus-per-node", "8", "--", "p"}, machine(4)),
            "mpirun -np 8 --map-by ppr:8:node --bind-to none --oversubscribe --mca orte_execute_quiet 1 -x OPENBLAS_NUM_THREADS=1 -x DTRAIN_STDOUT_IS_TTY=0 p");
}

TEST(MpirunCommand, HostsAcrossNodes) {
  // Ranks per node come from the slots, not -n: no oversubscription across 2 nodes.
  EXPECT_EQ(command({"-n", "4", "--hosts", "h1:2,h2:2", "--", "p"}, machine(2)),
            "mpirun -np 4 --host h1:2,h2:2 --map-by core --bind-to core --mca orte_execute_quiet 1 -x OPENBLAS_NUM_THREADS=1 -x DTRAIN_STDOUT_IS_TTY=0 p");
  EXPECT_EQ(command({"-n", "8", "--hosts", "h1:4,h2:4", "--gpus-per-node", "4", "--", "p"}, machine(32)),
            "mpirun -np 8 --host h1:4,h2:4 --map-by ppr:4:node:PE=8 --bind-to core --mca orte_execute_quiet 1 -x OPENBLAS_NUM_THREADS=8 -x DTRAIN_STDOUT_IS_TTY=0 p");
}

TEST(MpirunCommand, RankCountDefaultsToTheSlotsOfTheHosts) {
  EXPECT_EQ(command({"--hosts", "nodeA:2,nodeB:2", "--", "p"}, machine(2)),
            "mpirun -np 4 --host nodeA:2,nodeB:2 --map-by core --bind-to core --mca orte_execute_quiet 1 -x OPENBLAS_NUM_THREADS=1 -x DTRAIN_STDOUT_IS_TTY=0 p");
  EXPECT_THAT(command({"--hosts", "a,b,c", "--", "p"}, machine(2)), HasSubstr("-np 3 "));  // no count: one slot
  LaunchOptions o = opts({"--hostfile", "/etc/hosts.mpi", "--", "p"});
  o.hosts = {{"a", 2}, {"b", 3}};  // what load_hostfile would read
  EXPECT_EQ(resolve_launch(o, machine(4)).np, 5);
  EXPECT_EQ(resolve_launch(opts({"-n", "3", "--hosts", "a:2,b:2", "--", "p"}), machine(4)).np, 3);  // -n wins
}

TEST(MpirunCommand, MissingOrImpossibleRankCountsAreUsageErrors) {
  EXPECT_THAT(resolve_error(opts({"--", "p"}), machine(2)), HasSubstr("-n (number of ranks) is required when neither"));
  LaunchOptions o = opts({"--hostfile", "hf", "--", "p"});
  o.hosts = {{"a", 2}, {"b", 0}};
  EXPECT_THAT(resolve_error(o, machine(2)), HasSubstr("--hostfile hf gives no slot count for b"));
  EXPECT_THAT(resolve_error(opts({"-n", "5", "--hosts", "a:2,b:2", "--", "p"}), machine(2)),
              HasSubstr("-n 5 is more ranks than the 4 slot(s) of --hosts a:2,b:2"));
  EXPECT_THAT(resolve_error(opts({"-n", "2", "--", "p"}), machine(2)), ::testing::IsEmpty());
}

TEST(MpirunCommand, InsideSlurmTheAllocationGivesTheHosts) {
  EXPECT_EQ(command({"--", "p"}, machine(2, false, kSlurmTwoByTwo)),
            "mpirun -np 4 --host node01:2,node02:2 --map-by core --bind-to core --mca orte_execute_quiet 1 -x OPENBLAS_NUM_THREADS=1 -x DTRAIN_STDOUT_IS_TTY=0 p");
  LaunchOptions o = resolve_launch(opts({"-n", "3", "--", "p"}), machine(2, false, kSlurmTwoByTwo));
  EXPECT_TRUE(o.hosts_from_slurm);
  EXPECT_EQ(o.np, 3);
  EXPECT_THAT(resolve_error(opts({"-n", "5", "--", "p"}), machine(2, false, kSlurmTwoByTwo)),
              HasSubstr("-n 5 is more ranks than the 4 slot(s) of the Slurm allocation"));
}

TEST(MpirunCommand, ExplicitHostsWinOverSlurm) {
  EXPECT_THAT(command({"--hosts", "x:1", "--", "p"}, machine(2, false, kSlurmTwoByTwo)),
              ::testing::StartsWith("mpirun -np 1 --host x:1 "));
  LaunchOptions o = opts({"-n", "2", "--hostfile", "hf", "--", "p"});
  o.hosts = {{"y", 0}};
  EXPECT_FALSE(resolve_launch(o, machine(2, false, kSlurmTwoByTwo)).hosts_from_slurm);
}

TEST(MpirunCommand, SlurmWithoutTaskCountsNeedsRankCount) {
  const std::map<std::string, std::string> env = {{"SLURM_JOB_NODELIST", "n[1-2]"}};
  EXPECT_THAT(resolve_error(opts({"--", "p"}), machine(2, false, env)),
              HasSubstr("the Slurm allocation gives no slot count for n1"));
  // With -n, mpirun reads the allocation itself: no --host.
  EXPECT_EQ(command({"-n", "4", "--", "p"}, machine(2, false, env)),
            "mpirun -np 4 --map-by core --bind-to core --mca orte_execute_quiet 1 -x OPENBLAS_NUM_THREADS=1 -x DTRAIN_STDOUT_IS_TTY=0 p");
}

TEST(MpirunCommand, IfacePicksTheNetworkForTcpAndOutOfBand) {
  EXPECT_EQ(command({"--hosts", "a:1,b:1", "--iface", "198.18.0.0/24", "--", "p"}, machine(2)),
            "mpirun -np 2 --host a:1,b:1 --map-by slot:PE=2 --bind-to core --mca orte_execute_quiet 1 "
            "--mca btl_tcp_if_include 198.18.0.0/24 --mca oob_tcp_if_include 198.18.0.0/24 -x OPENBLAS_NUM_THREADS=2 -x DTRAIN_STDOUT_IS_TTY=0 p");
  EXPECT_THAT(command({"-n", "2", "--", "p"}, machine(2)), Not(HasSubstr("if_include")));
}

// Open MPI only warns about an if_include that matches nothing and then uses every interface.
TEST(MpirunCommand, IfaceThisNodeIsNotOnIsAUsageError) {
  LaunchHost host = machine(2);
  host.interfaces = {{"lo", 0x7f000001, 8}, {"eth0", 0xc6120001, 24}};  // 198.18.0.1/24
  EXPECT_NO_THROW(resolve_launch(opts({"-n", "2", "--iface", "198.18.0.0/24", "--", "p"}), host));
  EXPECT_NO_THROW(resolve_launch(opts({"-n", "2", "--iface", "eth0", "--", "p"}), host));
  EXPECT_EQ(resolve_error(opts({"-n", "2", "--iface", "10.99.0.0/24", "--", "p"}), host),
            "--iface: '10.99.0.0/24' matches no interface of this node (lo 127.0.0.1/8, eth0 198.18.0.1/24)");
  EXPECT_THAT(resolve_error(opts({"-n", "2", "--iface", "eth0,ib0", "--", "p"}), host), HasSubstr("'ib0'"));
}

// NCCL's bootstrap picks its own interface otherwise: on a multi-homed node, maybe one the
// other nodes cannot reach.
TEST(MpirunCommand, IfaceAlsoPicksNcclsNetworkWithCidrsResolvedToNames) {
  LaunchHost host = machine(2);
  host.interfaces = {{"lo", 0x7f000001, 8}, {"eth0", 0xc6120001, 24}, {"ib0", 0x0a010203, 16}};
  const std::vector<std::string> by_name = {"--hosts", "a:1,b:1", "--iface", "ib0", "--", "p"};
  EXPECT_EQ(command(by_name, host),
            "mpirun -np 2 --host a:1,b:1 --map-by slot:PE=2 --bind-to core --mca orte_execute_quiet 1 "
            "--mca btl_tcp_if_include ib0 --mca oob_tcp_if_include ib0 -x OPENBLAS_NUM_THREADS=2 "
            "-x DTRAIN_STDOUT_IS_TTY=0 -x NCCL_SOCKET_IFNAME==ib0 p");
  // MPI takes the subnet; NCCL takes names: the interface holding an address in it.
  EXPECT_THAT(command({"--hosts", "a:1,b:1", "--iface", "198.18.0.0/24", "--", "p"}, host),
              HasSubstr("--mca oob_tcp_if_include 198.18.0.0/24 -x OPENBLAS_NUM_THREADS=2 -x DTRAIN_STDOUT_IS_TTY=0 "
                        "-x NCCL_SOCKET_IFNAME==eth0 p"));
  EXPECT_THAT(command({"--hosts", "a:1,b:1", "--iface", "10.1.0.0/16,eth0", "--", "p"}, host),
              HasSubstr("-x NCCL_SOCKET_IFNAME==ib0,eth0 p"));
  // The user's own setting is forwarded, not overridden.
  host.env = {{"NCCL_SOCKET_IFNAME", "^docker"}};
  EXPECT_THAT(command(by_name, host), HasSubstr("-x NCCL_SOCKET_IFNAME -x OPENBLAS"));
  EXPECT_THAT(command(by_name, host), Not(HasSubstr("NCCL_SOCKET_IFNAME=")));
  EXPECT_THAT(command({"-n", "2", "--", "p"}, machine(2)), Not(HasSubstr("NCCL_SOCKET_IFNAME")));
}

TEST(MpirunCommand, OneHostIsASingleNode) {
  EXPECT_THAT(command({"-n", "4", "--hosts", "localhost:4", "--", "p"}, machine(2)), HasSubstr("--oversubscribe"));
}

TEST(MpirunCommand, Hostfile) {
  LaunchOptions o = opts({"-n", "6", "--hostfile", "/etc/hosts.mpi", "--", "p"});
  o.hosts = {{"a", 0}, {"b", 0}, {"c", 0}};  // what load_hostfile would read: slots unstated
  EXPECT_EQ(shell_join(build_mpirun_argv(o, machine(4))),
            "mpirun -np 6 --hostfile /etc/hosts.mpi --map-by slot:PE=2 --bind-to core --mca orte_execute_quiet 1 -x OPENBLAS_NUM_THREADS=2 -x DTRAIN_STDOUT_IS_TTY=0 p");
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
                             {"OPENBLAS_CORETYPE", "Haswell"},
                             {"HOME", "/root"},
                             {"OMPI_MCA_btl", "tcp,self"},
                             {"MY_NCCL_THING", "x"}});
  EXPECT_EQ(command({"-n", "2", "--", "p"}, host),
            "mpirun -np 2 --map-by core --bind-to core --mca orte_execute_quiet 1 -x CUDA_VISIBLE_DEVICES -x DTRAIN_TRACE -x NCCL_DEBUG "
            "-x OMP_NUM_THREADS -x OPENBLAS_CORETYPE -x OPENBLAS_NUM_THREADS=1 -x DTRAIN_STDOUT_IS_TTY=0 p");
}

TEST(MpirunCommand, UsersOpenblasThreadsWin) {
  EXPECT_EQ(command({"-n", "2", "--", "p"}, machine(16, false, {{"OPENBLAS_NUM_THREADS", "3"}})),
            "mpirun -np 2 --map-by slot:PE=8 --bind-to core --mca orte_execute_quiet 1 -x OPENBLAS_NUM_THREADS -x DTRAIN_STDOUT_IS_TTY=0 p");
}

TEST(MpirunCommand, RanksLearnWhetherTheLaunchersOutputIsATerminal) {
  LaunchHost tty = machine(2);
  tty.stdout_is_tty = true;
  EXPECT_EQ(command({"-n", "2", "--", "p"}, tty),
            "mpirun -np 2 --map-by core --bind-to core --mca orte_execute_quiet 1 -x OPENBLAS_NUM_THREADS=1 -x "
            "DTRAIN_STDOUT_IS_TTY=1 p");
  // A value the user set is forwarded by name, not overridden.
  EXPECT_EQ(command({"-n", "2", "--", "p"}, machine(2, false, {{"DTRAIN_STDOUT_IS_TTY", "0"}})),
            "mpirun -np 2 --map-by core --bind-to core --mca orte_execute_quiet 1 -x DTRAIN_STDOUT_IS_TTY -x "
            "OPENBLAS_NUM_THREADS=1 p");
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
