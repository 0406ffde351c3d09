// SelfCommunicator (one rank, no MPI): reduce_scatter and allgather are copies of the one block
// (none in place), kAvg over one rank is the value, and bad arguments throw as MPI's do.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "comm/self_communicator.h"
#include "core/error.h"
#include "tests/unit/data/error_of.h"

namespace dtrain {
namespace {

TEST(SelfCommunicator, ReduceScatterIsACopyOfTheOneBlock) {
  SelfCommunicator comm;
  const std::vector<float> send = {1.5f, -2.f, 3.25f};
  std::vector<float> recv(3, 0.f);
  EXPECT_TRUE(comm.reduce_scatter_async(send.data(), recv.data(), 3, DType::kF32, ReduceOp::kAvg)->test());
  EXPECT_EQ(recv, send);
  std::vector<float> in_place = send;
  comm.reduce_scatter(in_place.data(), in_place.data(), 3, DType::kF32, ReduceOp::kSum);
  EXPECT_EQ(in_place, send);
  std::vector<int32_t> ints = {7, 8}, out(2);
  comm.reduce_scatter(ints.data(), out.data(), 2, DType::kI32, ReduceOp::kSum);
  EXPECT_EQ(out, ints);
  comm.reduce_scatter(nullptr, nullptr, 0, DType::kF32, ReduceOp::kSum);
}

TEST(SelfCommunicator, ReduceScatterRejectsWhatMpiRejects) {
  SelfCommunicator comm;
  std::vector<int32_t> ints = {7, 8}, out(2);
  EXPECT_THROW(comm.reduce_scatter(ints.data(), out.data(), 2, DType::kI32, ReduceOp::kAvg), Error);
  EXPECT_THROW(comm.reduce_scatter(ints.data(), out.data(), -1, DType::kI32, ReduceOp::kSum), Error);
  EXPECT_THROW(comm.reduce_scatter(nullptr, out.data(), 2, DType::kI32, ReduceOp::kSum), Error);
}

TEST(SelfCommunicator, AllgatherIsACopyInPlaceOrNot) {
  SelfCommunicator comm;
  const std::vector<uint16_t> send = {1, 2, 3, 4};
  std::vector<uint16_t> recv(4, 0);
  comm.allgather(send.data(), recv.data(), 4, DType::kBF16);
  EXPECT_EQ(recv, send);
  comm.allgather(recv.data(), recv.data(), 4, DType::kBF16);
  EXPECT_EQ(recv, send);
}

// Note [Point-to-point]: one rank sends to itself within a batch; alone, an op would wait forever.
TEST(SelfCommunicator, PointToPointToItselfCopiesWithinABatchAndRefusesAnOpWithoutItsPartner) {
  SelfCommunicator comm;
  std::vector<float> a = {1.f, 2.f}, b(2, 0.f);
  comm.batch_p2p_async({{P2pOp::kSend, a.data(), 2, DType::kF32, 0, 4}, {P2pOp::kRecv, b.data(), 2, DType::kF32, 0, 4}})
      ->wait();
  EXPECT_EQ(b, a);
  auto error_of = [](auto f) { return testing::error_of(f).first; };
  EXPECT_NE(error_of([&] { comm.send(a.data(), 2, DType::kF32, 0, 1); }).find("no recv of that tag in the same batch"),
            std::string::npos);
  EXPECT_NE(error_of([&] { comm.recv(b.data(), 2, DType::kF32, 0, 1); }).find("no send of that tag in the same batch"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              comm.batch_p2p_async(
                  {{P2pOp::kSend, a.data(), 2, DType::kF32, 0, 4}, {P2pOp::kRecv, b.data(), 1, DType::kF32, 0, 4}});
            }).find("recv from rank 0 tag 4: expected 1 float32, rank 0 sent 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] { comm.send(a.data(), 2, DType::kF32, 1, 0); }).find("peer 1 is not a rank of 1"),
            std::string::npos);
  EXPECT_EQ(comm.split(3, 0, "x")->size(), 1);
}

}  // namespace
}  // namespace dtrain
