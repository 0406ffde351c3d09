// Slurm's compressed host lists and task counts as Slurm writes them (SLURM_JOB_NODELIST,
// SLURM_TASKS_PER_NODE), expanded the way scontrol show hostnames does; malformed ones are one
// UsageError naming the list; the allocation's hosts come from the environment given.
#include "launcher/slurm.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"

namespace dtrain::launcher {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

template <typename F>
std::string usage_error(F&& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(SlurmNodelist, RangesListsAndPlainNames) {
  EXPECT_THAT(expand_slurm_nodelist("node[01-03,07],gpu5"), ElementsAre("node01", "node02", "node03", "node07", "gpu5"));
  EXPECT_THAT(expand_slurm_nodelist("single"), ElementsAre("single"));
  EXPECT_THAT(expand_slurm_nodelist("a,b"), ElementsAre("a", "b"));
  EXPECT_THAT(expand_slurm_nodelist("n[5]"), ElementsAre("n5"));
}

TEST(SlurmNodelist, RangesKeepTheLowerBoundsWidth) {
  EXPECT_THAT(expand_slurm_nodelist("node[8-10]"), ElementsAre("node8", "node9", "node10"));
  EXPECT_THAT(expand_slurm_nodelist("node[08-10]"), ElementsAre("node08", "node09", "node10"));
  EXPECT_THAT(expand_slurm_nodelist("c[098-101]"), ElementsAre("c098", "c099", "c100", "c101"));
}

TEST(SlurmNodelist, SuffixesAndSeveralBracketGroups) {
  EXPECT_THAT(expand_slurm_nodelist("node[1-2]-ib"), ElementsAre("node1-ib", "node2-ib"));
  EXPECT_THAT(expand_slurm_nodelist("r[1-2]n[1,3]"), ElementsAre("r1n1", "r1n3", "r2n1", "r2n3"));
  EXPECT_THAT(expand_slurm_nodelist("gpu[1-2],cpu[10-11],login"),
              ElementsAre("gpu1", "gpu2", "cpu10", "cpu11", "login"));
}

TEST(SlurmNodelist, MalformedListsAreUsageErrorsNamingTheList) {
  EXPECT_THAT(usage_error([] { expand_slurm_nodelist("node[1-"); }), HasSubstr("Slurm host list 'node[1-'"));
  EXPECT_THAT(usage_error([] { expand_slurm_nodelist("node[1-2"); }), HasSubstr("'[' without ']'"));
  EXPECT_THAT(usage_error([] { expand_slurm_nodelist("node1]"); }), HasSubstr("']' without '['"));
  EXPECT_THAT(usage_error([] { expand_slurm_nodelist("node[3-1]"); }), HasSubstr("runs backwards"));
  EXPECT_THAT(usage_error([] { expand_slurm_nodelist("node[a-b]"); }), HasSubstr("'a' is not a number"));
  EXPECT_THAT(usage_error([] { expand_slurm_nodelist("node[]"); }), HasSubstr("empty []"));
  EXPECT_THAT(usage_error([] { expand_slurm_nodelist("node[1,,2]"); }), HasSubstr("'' is not a number"));
  EXPECT_THAT(usage_error([] { expand_slurm_nodelist("a,,b"); }), HasSubstr("empty"));
  EXPECT_THAT(usage_error([] { expand_slurm_nodelist(""); }), HasSubstr("empty"));
  EXPECT_THAT(usage_error([] { expand_slurm_nodelist("a,"); }), HasSubstr("empty"));
  EXPECT_THAT(usage_error([] { expand_slurm_nodelist("n[[1]]"); }), HasSubstr("inside []"));
  EXPECT_THAT(usage_error([] { expand_slurm_nodelist("n[1-2]x]"); }), HasSubstr("']' without '['"));
}

TEST(SlurmNodelist, AHugeExpansionIsRefusedNotAttempted) {
  EXPECT_THAT(usage_error([] { expand_slurm_nodelist("n[0-99999999999]"); }), HasSubstr("more than 65536 hosts"));
  EXPECT_THAT(usage_error([] { expand_slurm_nodelist("a[0-999]b[0-999]"); }), HasSubstr("more than 65536 hosts"));
  EXPECT_THAT(usage_error([] { expand_slurm_nodelist("n[0-99999999999999999999]"); }), HasSubstr("not a number"));
}

TEST(SlurmTasksPerNode, CountsAndRepeats) {
  EXPECT_THAT(expand_slurm_tasks_per_node("2(x3),1"), ElementsAre(2, 2, 2, 1));
  EXPECT_THAT(expand_slurm_tasks_per_node("4"), ElementsAre(4));
  EXPECT_THAT(expand_slurm_tasks_per_node("1,2(x2)"), ElementsAre(1, 2, 2));
  EXPECT_THAT(usage_error([] { expand_slurm_tasks_per_node("2(x3"); }), HasSubstr("Slurm tasks per node '2(x3'"));
  EXPECT_THAT(usage_error([] { expand_slurm_tasks_per_node("0"); }), HasSubstr("at least 1"));
  EXPECT_THAT(usage_error([] { expand_slurm_tasks_per_node("two"); }), HasSubstr("not a number"));
  EXPECT_THAT(usage_error([] { expand_slurm_tasks_per_node("2(x0)"); }), HasSubstr("at least 1"));
  EXPECT_THAT(usage_error([] { expand_slurm_tasks_per_node("1(x99999999)"); }), HasSubstr("more than"));
}

TEST(SlurmHosts, OutsideAnAllocationThereAreNone) {
  EXPECT_TRUE(slurm_hosts({}).empty());
  EXPECT_TRUE(slurm_hosts({{"SLURM_TASKS_PER_NODE", "2"}}).empty());
}

TEST(SlurmHosts, NodesWithTheirTaskCounts) {
  EXPECT_THAT(slurm_hosts({{"SLURM_JOB_NODELIST", "node[01-03]"}, {"SLURM_TASKS_PER_NODE", "2(x2),1"}}),
              ElementsAre(HostSlots{"node01", 2}, HostSlots{"node02", 2}, HostSlots{"node03", 1}));
  // SLURM_TASKS_PER_NODE says what each node got; SLURM_NTASKS_PER_NODE is only the request.
  EXPECT_THAT(slurm_hosts({{"SLURM_JOB_NODELIST", "a,b"},
                           {"SLURM_TASKS_PER_NODE", "3,1"},
                           {"SLURM_NTASKS_PER_NODE", "2"}}),
              ElementsAre(HostSlots{"a", 3}, HostSlots{"b", 1}));
  EXPECT_THAT(slurm_hosts({{"SLURM_JOB_NODELIST", "a,b"}, {"SLURM_NTASKS_PER_NODE", "4"}}),
              ElementsAre(HostSlots{"a", 4}, HostSlots{"b", 4}));
  EXPECT_THAT(slurm_hosts({{"SLURM_JOB_NODELIST", "a,b"}}), ElementsAre(HostSlots{"a", 0}, HostSlots{"b", 0}));
}

TEST(SlurmHosts, CountsThatDoNotMatchTheNodesAreAnError) {
  EXPECT_THAT(usage_error([] { slurm_hosts({{"SLURM_JOB_NODELIST", "n[1-3]"}, {"SLURM_TASKS_PER_NODE", "2(x2)"}}); }),
              HasSubstr("SLURM_TASKS_PER_NODE '2(x2)' gives 2 node(s) but SLURM_JOB_NODELIST 'n[1-3]' names 3"));
  EXPECT_THAT(usage_error([] { slurm_hosts({{"SLURM_JOB_NODELIST", "n1"}, {"SLURM_NTASKS_PER_NODE", "2,3"}}); }),
              HasSubstr("not one number"));
}

}  // namespace
}  // namespace dtrain::launcher
