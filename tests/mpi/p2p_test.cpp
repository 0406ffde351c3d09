// Point-to-point batches and sub-communicators at 2, 3 and 4 ranks (Note [Point-to-point],
// Note [Sub-communicators] in comm/communicator.h): a ring of large messages in both directions
// (no deadlock, right bits), the P x D grid's groups, count and dtype mismatches named in one
// line, the flight recorder's records, and a communicator that carries one kind of traffic.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "comm/mpi_communicator.h"
#include "core/error.h"
#include "tests/mpi/collective_test_util.h"
#include "tests/mpi/mpi_test_env.h"

namespace dtrain {
namespace {

using testing::error_of;
using testing::test_comm;

// Beyond any eager limit: blocking sends of this size wait for their receive.
constexpr int64_t kBig = 1 << 20;

std::vector<float> filled(int64_t n, int rank) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(rank * 1000 + i % 997);
  return v;
}

TEST(P2p, ARingOfLargeMessagesBothWaysInOneBatchCompletesWithTheSendersBits) {
  auto chain = test_comm().split(0, test_comm().rank(), "p2p-ring");
  const int n = chain->size(), r = chain->rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  std::vector<float> to_next = filled(kBig, r), to_prev = filled(kBig, r + 100);
  std::vector<float> from_prev(kBig), from_next(kBig);
  // Every rank sends first in its batch: as blocking calls this order deadlocks (each waits for
  // a receive its peer has not posted); posted together it cannot.
  chain
      ->batch_p2p_async({{P2pOp::kSend, to_next.data(), kBig, DType::kF32, next, 1},
                         {P2pOp::kSend, to_prev.data(), kBig, DType::kF32, prev, 2},
                         {P2pOp::kRecv, from_prev.data(), kBig, DType::kF32, prev, 1},
                         {P2pOp::kRecv, from_next.data(), kBig, DType::kF32, next, 2}})
      ->wait();
  EXPECT_EQ(from_prev, filled(kBig, prev));
  EXPECT_EQ(from_next, filled(kBig, next + 100));
  chain->shutdown();
}

TEST(P2p, SendsAndReceivesInSeparateBatchesMatchInIssueOrder) {
  auto chain = test_comm().split(0, test_comm().rank(), "p2p-order");
  const int n = chain->size(), r = chain->rank();
  // Rank 0 sends three messages of one tag to the last rank, which receives them in order.
  std::vector<WorkHandle> works;
  std::vector<std::vector<int32_t>> bufs(3, std::vector<int32_t>(5));
  for (int i = 0; i < 3; ++i) {
    if (r == 0) {
      std::fill(bufs[static_cast<size_t>(i)].begin(), bufs[static_cast<size_t>(i)].end(), i + 1);
      works.push_back(chain->send_async(bufs[static_cast<size_t>(i)].data(), 5, DType::kI32, n - 1, 7));
    } else if (r == n - 1) {
      works.push_back(chain->recv_async(bufs[static_cast<size_t>(i)].data(), 5, DType::kI32, 0, 7));
    }
  }
  for (auto& w : works) w->wait();
  if (r == n - 1) {
    for (int i = 0; i < 3; ++i) EXPECT_EQ(bufs[static_cast<size_t>(i)], std::vector<int32_t>(5, i + 1));
  }
  chain->shutdown();
}

TEST(P2p, ARecordInTheFlightRecorderNamesThePeerAsAWorldRank) {
  auto base = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, CollectiveOptions{60, 100, "", false, true, "p2p-rec"});
  // Reverse the ranks so that the chain's ranks are not the world's.
  auto chain = base->split(0, -base->rank(), "p2p-rec-chain");
  const int n = chain->size(), r = chain->rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  float out = static_cast<float>(base->rank()), in = -1;
  chain->batch_p2p_async({{P2pOp::kSend, &out, 1, DType::kF32, next, 0}, {P2pOp::kRecv, &in, 1, DType::kF32, prev, 0}})
      ->wait();
  const int world_prev = n - 1 - prev;  // chain rank c is world rank n - 1 - c
  EXPECT_EQ(in, static_cast<float>(world_prev));
  const auto& rec = dynamic_cast<MpiCommunicator&>(*chain).flight_recorder().snapshot();
  ASSERT_EQ(rec.size(), 1u);
  EXPECT_EQ(rec[0].kind, "sendrecv");
  EXPECT_EQ(rec[0].count, 2);
  EXPECT_NE(rec[0].label.find(fmt::format("from rank {} tag 0", world_prev)), std::string::npos) << rec[0].label;
  EXPECT_NE(rec[0].label.find(fmt::format("to rank {} tag 0", n - 1 - next)), std::string::npos) << rec[0].label;
  EXPECT_EQ(collective_state_name(rec[0].state), std::string("completed"));
  chain->shutdown();
  base->shutdown();
}

TEST(P2p, AnotherCountIsOneLineNamingThePeerTheTagAndBothCounts) {
  auto chain = test_comm().split(0, test_comm().rank(), "p2p-count");
  const int n = chain->size(), r = chain->rank();
  std::vector<float> buf(16, 1.f);
  for (const int64_t sent : {int64_t{10}, int64_t{14}}) {  // fewer, then more, than expected
    std::string error;
    if (r == 0) chain->send(buf.data(), sent, DType::kF32, n - 1, 3);
    if (r == n - 1) error = error_of([&] { chain->recv(buf.data(), 12, DType::kF32, 0, 3); });
    if (r == n - 1) {
      EXPECT_NE(error.find("recv from rank 0 tag 3: expected 12 float32, rank 0 sent"), std::string::npos) << error;
      if (sent == 10) {
        EXPECT_NE(error.find("sent 10"), std::string::npos) << error;
      }
    }
  }
  chain->shutdown();
}

// Note [Point-to-point headers]: the header says what was sent, so another dtype is named too.
TEST(P2p, AnotherDtypeOfTheSameSizeIsNamed) {
  auto chain = test_comm().split(0, test_comm().rank(), "p2p-hdr");
  const int n = chain->size(), r = chain->rank();
  std::vector<int32_t> buf(4, 1);
  std::string error;
  if (r == 0) chain->send(buf.data(), 4, DType::kI32, n - 1, 9);
  if (r == n - 1) error = error_of([&] { chain->recv(buf.data(), 4, DType::kF32, 0, 9); });
  if (r == n - 1) {
    EXPECT_NE(error.find("recv from rank 0 tag 9: expected 4 float32, rank 0 sent 4 int32"), std::string::npos)
        << error;
  }
  chain->shutdown();
}

TEST(P2p, ACommunicatorCarriesCollectivesOrPointToPointNotBoth) {
  auto chain = test_comm().split(0, test_comm().rank(), "p2p-mode");
  float x = 1;
  const std::string on_world = error_of([&] { test_comm().send(&x, 1, DType::kF32, 0, 0); });
  EXPECT_NE(on_world.find("split() a communicator of its own"), std::string::npos) << on_world;
  const int n = chain->size(), r = chain->rank();
  chain->batch_p2p_async({{P2pOp::kSend, &x, 1, DType::kF32, (r + 1) % n, 0},
                          {P2pOp::kRecv, &x, 1, DType::kF32, (r + n - 1) % n, 0}})
      ->wait();
  const std::string collective = error_of([&] { chain->allreduce(&x, 1, DType::kF32, ReduceOp::kSum); });
  EXPECT_NE(collective.find("a collective on a communicator that already runs point-to-point"), std::string::npos)
      << collective;
  chain->shutdown();
}

TEST(P2p, BadPeersTagsAndDuplicateOpsAreRefusedBeforeAnythingMoves) {
  auto chain = test_comm().split(0, test_comm().rank(), "p2p-bad");
  float x = 0;
  const int n = chain->size();
  EXPECT_NE(error_of([&] { chain->send(&x, 1, DType::kF32, n, 0); }).find(fmt::format("peer {} is not a rank of {}", n, n)),
            std::string::npos);
  EXPECT_NE(error_of([&] { chain->send(&x, 1, DType::kF32, 0, kMaxP2pTag + 1); }).find("tag 16384 is outside"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              chain->batch_p2p_async({{P2pOp::kRecv, &x, 1, DType::kF32, 0, 1}, {P2pOp::kRecv, &x, 1, DType::kF32, 0, 1}});
            }).find("two ops of one batch"),
            std::string::npos);
  chain->shutdown();
}

// Note [Pipeline grid] (pipeline/grid.h): world rank w = d * P + s is stage s of pipeline d.
TEST(P2p, TheGridsGroupsHoldTheRightRanksAndRunAlongside) {
  const int world = test_comm().size(), w = test_comm().rank();
  for (int stages = 1; stages <= world; ++stages) {
    if (world % stages != 0) continue;
    const int s = w % stages, d = w / stages;
    auto dp = test_comm().split(s, d, fmt::format("grid-stage{}", s));
    auto chain = test_comm().split(d, s, fmt::format("grid-pipeline{}", d));
    ASSERT_EQ(dp->size(), world / stages);
    ASSERT_EQ(chain->size(), stages);
    EXPECT_EQ(dp->rank(), d);
    EXPECT_EQ(chain->rank(), s);
    // The stage group's sum of world ranks, while the chain passes a value down the stages.
    int32_t sum = w;
    WorkHandle reduce = dp->allreduce_async(&sum, 1, DType::kI32, ReduceOp::kSum);
    int32_t token = s == 0 ? 1000 + d : -1;
    if (s > 0) chain->recv(&token, 1, DType::kI32, s - 1, 0);
    if (s + 1 < stages) chain->send(&token, 1, DType::kI32, s + 1, 0);
    reduce->wait();
    int32_t expected = 0;
    for (int dd = 0; dd < world / stages; ++dd) expected += dd * stages + s;
    EXPECT_EQ(sum, expected);
    EXPECT_EQ(token, 1000 + d);
    chain->shutdown();
    dp->shutdown();
  }
}

}  // namespace
}  // namespace dtrain
