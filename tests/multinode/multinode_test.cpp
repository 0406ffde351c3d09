// Placement and links across the multi-node test bed (scripts/testbed.sh): every rank runs on
// the fake node its slot says, local ranks and local sizes follow the fake nodes (what
// MPI_Comm_split_type(SHARED) groups), and a collective between nodes really crosses their
// links (TCP over the bridge), not memory shared behind the test bed's back.
//
// DTRAIN_TEST_HOSTS names the layout the job was started with ("nodeA:2,nodeB:2", as mpirun's
// --host; ranks fill each node's slots in order); without it every test skips. Tests use EXPECT
// between collectives so a failing rank still issues every collective its peers do.
#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/mpi/mpi_test_env.h"

namespace dtrain {
namespace {

using testing::test_comm;

struct ExpectedPlace {
  std::string host;
  int local_rank = 0, local_size = 0;
};

// "nodeA:2,nodeB:1" -> nodeA/0/2, nodeA/1/2, nodeB/0/1: mpirun's by-slot fill.
std::vector<ExpectedPlace> expected_layout(const std::string& hosts) {
  std::vector<ExpectedPlace> places;
  std::stringstream list(hosts);
  for (std::string item; std::getline(list, item, ',');) {
    const size_t colon = item.find(':');
    const int slots = colon == std::string::npos ? 1 : std::atoi(item.c_str() + colon + 1);
    for (int i = 0; i < slots; ++i) places.push_back({item.substr(0, colon), i, slots});
  }
  return places;
}

// One rank's view of itself, gathered as I32 words.
struct Placement {
  int32_t rank = 0, local_rank = 0, local_size = 0;
  std::array<char, 52> host{};
};
static_assert(sizeof(Placement) % 4 == 0);

std::vector<Placement> gather_placements() {
  Communicator& comm = test_comm();
  Placement mine{comm.rank(), comm.local_rank(), comm.local_size(), {}};
  gethostname(mine.host.data(), mine.host.size() - 1);
  std::vector<Placement> all(static_cast<size_t>(comm.size()));
  comm.allgather(&mine, all.data(), sizeof(Placement) / 4, DType::kI32);
  return all;
}

class TestBed : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* hosts = std::getenv("DTRAIN_TEST_HOSTS");
    if (hosts == nullptr) GTEST_SKIP() << "DTRAIN_TEST_HOSTS is not set: not started on the test bed";
    expected_ = expected_layout(hosts);
  }
  std::vector<ExpectedPlace> expected_;
};

TEST_F(TestBed, EveryRankRunsOnTheNodeItsSlotSays) {
  std::vector<Placement> all = gather_placements();
  ASSERT_EQ(all.size(), expected_.size()) << "ranks started vs slots in DTRAIN_TEST_HOSTS";
  for (size_t r = 0; r < all.size(); ++r) EXPECT_EQ(all[r].host.data(), expected_[r].host) << "rank " << r;
}

TEST_F(TestBed, LocalRanksAndSizesFollowTheFakeNodes) {
  std::vector<Placement> all = gather_placements();
  ASSERT_EQ(all.size(), expected_.size());
  for (size_t r = 0; r < all.size(); ++r) {
    EXPECT_EQ(all[r].local_rank, expected_[r].local_rank) << "rank " << r << " on " << all[r].host.data();
    EXPECT_EQ(all[r].local_size, expected_[r].local_size) << "rank " << r << " on " << all[r].host.data();
  }
}

// Bytes this network namespace's eth0 (the node's end of its veth link) has received.
int64_t link_rx_bytes() {
  std::ifstream dev("/proc/net/dev");  // per network namespace, unlike /sys/class/net
  for (std::string line; std::getline(dev, line);) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    if (name == "eth0") return std::atoll(line.c_str() + colon + 1);
  }
  return -1;
}

// Whatever the algorithm, a node cannot hold the sum without receiving a full-size function
// of the other nodes' data: at least the buffer's bytes arrive over its link.
TEST_F(TestBed, AllreduceBetweenNodesCrossesEveryNodesLink) {
  std::set<std::string> hosts;
  for (const ExpectedPlace& p : expected_) hosts.insert(p.host);
  if (hosts.size() < 2) GTEST_SKIP() << "one node: nothing crosses a link";
  Communicator& comm = test_comm();
  constexpr int64_t kCount = 1 << 20;  // 4 MiB
  std::vector<float> v(kCount, 1.0f);
  // Read before the first barrier: no rank can start the all-reduce (and send) until every
  // rank has entered it. After the second, every rank's part has arrived.
  const int64_t before = link_rx_bytes();
  comm.barrier();
  comm.allreduce(v.data(), kCount, DType::kF32, ReduceOp::kSum);
  comm.barrier();
  const int64_t received = link_rx_bytes() - before;
  EXPECT_GE(before, 0) << "no eth0 in this rank's network namespace";
  EXPECT_GE(received, kCount * 4) << "bytes received on " << expected_[test_comm().rank()].host << "'s link";
  EXPECT_EQ(v.front(), static_cast<float>(comm.size()));
  EXPECT_EQ(v.back(), static_cast<float>(comm.size()));
}

}  // namespace
}  // namespace dtrain
