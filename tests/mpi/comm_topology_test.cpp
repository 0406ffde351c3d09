// The world communicator's identity and placement: ranks 0..size-1, local ranks distinct and
// dense among the ranks on each node, agreement with the launcher's variables, the CPU stream,
// and no CPU burnt while the communicator is idle (its thread sleeps, nothing polls MPI).
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/mpi/mpi_test_env.h"

namespace dtrain {
namespace {

using testing::test_comm;

struct Placement {
  int32_t rank, local_rank, local_size, host_hash;
};

int32_t host_hash() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  uint32_t h = 2166136261u;
  for (const char* c = name; *c; ++c) h = (h ^ static_cast<uint8_t>(*c)) * 16777619u;
  return static_cast<int32_t>(h & 0x7fffffff);
}

std::vector<Placement> gather_placements() {
  Communicator& comm = test_comm();
  Placement mine{comm.rank(), comm.local_rank(), comm.local_size(), host_hash()};
  std::vector<Placement> all(static_cast<size_t>(comm.size()));
  comm.allgather(&mine, all.data(), 4, DType::kI32);
  return all;
}

TEST(Topology, RanksAreZeroToSizeInOrder) {
  std::vector<Placement> all = gather_placements();
  for (size_t r = 0; r < all.size(); ++r) EXPECT_EQ(all[r].rank, static_cast<int32_t>(r));
  if (const char* world = std::getenv("OMPI_COMM_WORLD_SIZE")) {
    EXPECT_EQ(test_comm().size(), std::atoi(world));
  }
}

TEST(Topology, LocalRanksAreDistinctAndDensePerNode) {
  std::vector<Placement> all = gather_placements();
  std::set<int32_t> hosts;
  for (const Placement& p : all) hosts.insert(p.host_hash);
  for (int32_t host : hosts) {
    std::set<int32_t> local_ranks;
    int32_t on_host = 0;
    for (const Placement& p : all) {
      if (p.host_hash != host) continue;
      ++on_host;
      local_ranks.insert(p.local_rank);
    }
    EXPECT_EQ(static_cast<int32_t>(local_ranks.size()), on_host) << "local ranks repeat on a node";
    EXPECT_EQ(*local_ranks.begin(), 0);
    EXPECT_EQ(*local_ranks.rbegin(), on_host - 1);
    for (const Placement& p : all) {
      if (p.host_hash == host) {
        EXPECT_EQ(p.local_size, on_host);
      }
    }
  }
  if (hosts.size() == 1) {
    EXPECT_EQ(test_comm().local_size(), test_comm().size());
  }
}

TEST(Topology, AgreesWithMpirunsLocalRank) {
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  if (local == nullptr) GTEST_SKIP() << "not started by mpirun";
  EXPECT_EQ(test_comm().local_rank(), std::atoi(local));
}

TEST(Topology, BackendAndStream) {
  EXPECT_EQ(test_comm().backend(), "mpi");
  EXPECT_TRUE(test_comm().stream().device().is_cpu());
}

// CPU seconds used so far by dtrain's own threads (named "dtrain-*": the communication threads,
// where a spinning poll would be). Open MPI's own TCP progress threads are left out: across
// test-bed nodes they use a tenth of a core in system time while idle, which is not ours to fix.
double dtrain_threads_cpu_seconds() {
  double ticks = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream stat(task.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const size_t open = line.find('('), close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    if (line.compare(open + 1, 7, "dtrain-") != 0) continue;
    std::istringstream rest(line.substr(close + 2));
    std::string field;
    for (int i = 3; i <= 13; ++i) rest >> field;  // state .. cmajflt (fields 3-13)
    double utime = 0, stime = 0;
    rest >> utime >> stime;
    ticks += utime + stime;
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// A spinning communication thread (or MPI polling on it) would use about a core for the whole
// sleep; an idle one uses next to nothing. The bound is a fraction of the sleep, not a time budget.
TEST(Topology, IdleCommunicatorBurnsNoCpu) {
  test_comm().barrier();
  const double before = dtrain_threads_cpu_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const double used = dtrain_threads_cpu_seconds() - before;
  EXPECT_LT(used, 0.1) << "CPU seconds used by dtrain's communication threads while idle for 0.5 s";
  test_comm().barrier();
}

}  // namespace
}  // namespace dtrain
