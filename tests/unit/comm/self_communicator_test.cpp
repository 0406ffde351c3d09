// SelfCommunicator (one rank, no MPI): reduce_scatter and allgather are copies of the one block
// (none in place), kAvg over one rank is the value, and bad arguments throw as MPI's do.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "comm/self_communicator.h"
#include "core/error.h"

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

}  // namespace
}  // namespace dtrain
