// dtrain-launch's flag parsing: the program after `--` is kept verbatim, hosts and hostfiles
// are read the way mpirun reads them, and every bad flag is a UsageError (exit 2).
#include "launcher/launch_options.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"

namespace dtrain::launcher {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string usage_error(const std::vector<std::string>& args) {
  try {
    parse_launch_args(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(LaunchOptions, ParsesEveryFlagAndKeepsTheProgramVerbatim) {
  LaunchOptions o = parse_launch_args({"-n", "4", "--hosts", "h1:2,h2:2", "--gpus-per-node", "2", "--dry-run",
                                       "--mpirun", "/opt/ompi/bin/mpirun", "--", "dtrain", "train", "-n", "--", "x y"});
  EXPECT_EQ(o.np, 4);
  EXPECT_EQ(o.hosts_flag, "h1:2,h2:2");
  EXPECT_THAT(o.hosts, ElementsAre(HostSlots{"h1", 2}, HostSlots{"h2", 2}));
  EXPECT_EQ(o.gpus_per_node, 2);
  EXPECT_TRUE(o.dry_run);
  EXPECT_EQ(o.mpirun, "/opt/ompi/bin/mpirun");
  // The program's own -n and -- belong to it.
  EXPECT_THAT(o.program, ElementsAre("dtrain", "train", "-n", "--", "x y"));
}

TEST(LaunchOptions, Defaults) {
  LaunchOptions o = parse_launch_args({"--np=2", "--", "prog"});
  EXPECT_EQ(o.np, 2);
  EXPECT_TRUE(o.hosts.empty());
  EXPECT_TRUE(o.hostfile.empty());
  EXPECT_EQ(o.gpus_per_node, 0);
  EXPECT_FALSE(o.dry_run);
  EXPECT_EQ(o.mpirun, "mpirun");
}

TEST(LaunchOptions, HelpNeedsNothingElse) { EXPECT_TRUE(parse_launch_args({"--help"}).help); }

TEST(LaunchOptions, BadFlagsAreUsageErrors) {
  EXPECT_THAT(usage_error({"-n", "0", "--", "prog"}), HasSubstr("-n: '0' is not a positive integer"));
  EXPECT_THAT(usage_error({"-n", "two", "--", "prog"}), HasSubstr("-n: 'two'"));
  EXPECT_THAT(usage_error({"-n", "2"}), HasSubstr("no program to run"));
  EXPECT_THAT(usage_error({"-n", "2", "--"}), HasSubstr("no program to run"));
  EXPECT_THAT(usage_error({"-n", "2", "prog"}), HasSubstr("unexpected argument 'prog'"));
  EXPECT_THAT(usage_error({"-n", "2", "--bogus", "--", "prog"}), HasSubstr("bogus"));
  EXPECT_THAT(usage_error({"-n", "2", "--gpus-per-node", "-1", "--", "p"}), HasSubstr("--gpus-per-node"));
  EXPECT_THAT(usage_error({"-n", "2", "--hosts", "a:1", "--hostfile", "f", "--", "p"}), HasSubstr("not both"));
  EXPECT_THAT(usage_error({"-n", "2", "--hosts", "a:x", "--", "p"}), HasSubstr("slot count"));
  EXPECT_THAT(usage_error({"-n", "2", "--hosts", "a,,b", "--", "p"}), HasSubstr("empty host name"));
  EXPECT_THAT(usage_error({"-n", "2", "--mpirun", "", "--", "p"}), HasSubstr("--mpirun"));
}

TEST(LaunchOptions, StartTimeoutAndRestarts) {
  const LaunchOptions defaults = parse_launch_args({"-n", "2", "--", "p"});
  EXPECT_EQ(defaults.start_timeout_s, 300);
  EXPECT_EQ(defaults.max_restarts, 0);
  const LaunchOptions o =
      parse_launch_args({"-n", "2", "--start-timeout", "2.5", "--max-restarts", "3", "--", "p", "--checkpoint-dir", "c"});
  EXPECT_EQ(o.start_timeout_s, 2.5);
  EXPECT_EQ(o.max_restarts, 3);
  EXPECT_EQ(parse_launch_args({"-n", "2", "--start-timeout", "0", "--", "p"}).start_timeout_s, 0);
  EXPECT_THAT(usage_error({"-n", "2", "--start-timeout", "-1", "--", "p"}), HasSubstr("--start-timeout: '-1'"));
  EXPECT_THAT(usage_error({"-n", "2", "--start-timeout", "5m", "--", "p"}), HasSubstr("--start-timeout: '5m'"));
  EXPECT_THAT(usage_error({"-n", "2", "--start-timeout", "nan", "--", "p"}), HasSubstr("--start-timeout"));
  EXPECT_THAT(usage_error({"-n", "2", "--start-timeout", "1e300", "--", "p"}), HasSubstr("--start-timeout"));
  EXPECT_THAT(usage_error({"-n", "2", "--max-restarts", "-1", "--", "p", "--checkpoint-dir", "c"}),
              HasSubstr("--max-restarts: '-1'"));
}

// The ranks' time to save after an interrupt: 30 s unless --stop-timeout says otherwise.
TEST(LaunchOptions, StopTimeout) {
  EXPECT_EQ(parse_launch_args({"-n", "2", "--", "p"}).stop_timeout_s, 30);
  EXPECT_EQ(parse_launch_args({"-n", "2", "--stop-timeout", "2.5", "--", "p"}).stop_timeout_s, 2.5);
  EXPECT_THAT(usage_error({"-n", "2", "--stop-timeout", "5s", "--", "p"}), HasSubstr("--stop-timeout: '5s'"));
}

TEST(LaunchOptions, RestartsNeedTheProgramToWriteCheckpoints) {
  EXPECT_EQ(usage_error({"-n", "2", "--max-restarts", "2", "--", "dtrain", "train"}),
            "--max-restarts needs checkpoints to resume from: give the program --checkpoint-dir DIR");
  EXPECT_EQ(usage_error({"-n", "2", "--max-restarts", "2", "--", "dtrain", "train", "--checkpoint-dir=c"}), "");
}

TEST(LaunchOptions, RankCountIsOptional) {
  // resolve_launch (mpirun_command.h) takes it from the slots, or says it is missing.
  EXPECT_EQ(parse_launch_args({"--hosts", "a:2,b:2", "--", "prog"}).np, 0);
  EXPECT_EQ(parse_launch_args({"--", "prog"}).np, 0);
}

TEST(LaunchOptions, IfaceIsCheckedWhenParsed) {
  EXPECT_EQ(parse_launch_args({"-n", "2", "--iface", "198.18.0.0/24", "--", "p"}).iface, "198.18.0.0/24");
  EXPECT_EQ(usage_error({"-n", "2", "--iface", "10.0.0.0/33", "--", "p"}),
            "--iface: '10.0.0.0/33' is neither an interface name (eth1) nor an IPv4 CIDR (10.1.0.0/16)");
}

TEST(LaunchOptions, HostsWithoutCountsHaveOneSlot) {
  EXPECT_THAT(parse_hosts("a,b:3,c"), ElementsAre(HostSlots{"a", 1}, HostSlots{"b", 3}, HostSlots{"c", 1}));
}

TEST(LaunchOptions, HostfileLinesCommentsAndSlots) {
  EXPECT_THAT(parse_hostfile("# cluster\nnode1 slots=4 max_slots=8\n\n  node2   # spare\nnode3 slots=2\r\n"),
              ElementsAre(HostSlots{"node1", 4}, HostSlots{"node2", 0}, HostSlots{"node3", 2}));
  EXPECT_THROW(parse_hostfile("node1 slots=zero\n"), UsageError);
}

TEST(LaunchOptions, LoadHostfileReadsTheFileAndRejectsMissingOrEmptyOnes) {
  auto path = std::filesystem::temp_directory_path() / ("dtrain_hostfile_" + std::to_string(::getpid()));
  std::ofstream(path) << "a slots=2\nb slots=2\n";
  LaunchOptions o = parse_launch_args({"-n", "4", "--hostfile", path.string(), "--", "p"});
  load_hostfile(o);
  EXPECT_THAT(o.hosts, ElementsAre(HostSlots{"a", 2}, HostSlots{"b", 2}));
  std::ofstream(path) << "# nothing\n";
  EXPECT_THROW(load_hostfile(o), UsageError);
  std::filesystem::remove(path);
  EXPECT_THROW(load_hostfile(o), UsageError);
}

}  // namespace
}  // namespace dtrain::launcher
