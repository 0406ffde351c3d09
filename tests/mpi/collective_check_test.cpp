// The per-collective header check (CollectiveOptions::check_every_collective, dtrain train
// --debug-collectives) through the library API at np 2 and 3: ranks that issue collectives of
// another count, kind or dtype all get one error naming the difference and the ranks, none
// hangs, and the communicator goes on working afterwards (every rank took the same decision).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <mpi.h>

#include "comm/mpi_communicator.h"
#include "core/error.h"
#include "tests/mpi/collective_test_util.h"

namespace dtrain {
namespace {

CollectiveOptions checked() {
  CollectiveOptions o;
  o.timeout_s = 60;
  o.check_every_collective = true;
  return o;
}

using testing::error_of;

TEST(CollectiveCheck, DifferentCountsAreOneErrorOnEveryRankNamingTheRanks) {
  MpiCommunicator comm(MPI_COMM_WORLD, checked());
  const int rank = comm.rank();
  std::vector<int32_t> v(8, 1);
  const int64_t count = rank == 0 ? 4 : 5;  // rank 0 differs
  const std::string error = error_of([&] { comm.allreduce(v.data(), count, DType::kI32, ReduceOp::kSum); });
  EXPECT_NE(error.find("ranks issued different collectives at #1"), std::string::npos) << error;
  EXPECT_NE(error.find("rank 0: allreduce of 4 int32"), std::string::npos) << error;
  EXPECT_NE(error.find(comm.size() == 2 ? "rank 1: allreduce of 5 int32" : "ranks 1,2: allreduce of 5 int32"),
            std::string::npos)
      << error;
  // Every rank threw before the data moved: the next collective matches up and is right.
  int32_t one = 1;
  comm.allreduce(&one, 1, DType::kI32, ReduceOp::kSum);
  EXPECT_EQ(one, comm.size());
  comm.shutdown();
}

TEST(CollectiveCheck, DifferentKindsAndDtypesAreCaught) {
  MpiCommunicator comm(MPI_COMM_WORLD, checked());
  std::vector<int32_t> v(static_cast<size_t>(4 * comm.size()), 1);
  const bool last = comm.rank() == comm.size() - 1;
  const std::string kinds = error_of([&] {
    if (last) comm.allgather(v.data(), v.data(), 4, DType::kI32);
    else comm.broadcast(v.data(), 4, DType::kI32, 0);
  });
  EXPECT_NE(kinds.find("broadcast of 4 int32"), std::string::npos) << kinds;
  EXPECT_NE(kinds.find(fmt::format("rank {}: allgather of 4 int32", comm.size() - 1)), std::string::npos) << kinds;
  std::vector<float> f(4, 1.f);
  const std::string dtypes = error_of([&] {
    if (last) comm.broadcast(f.data(), 4, DType::kF32, 0);
    else comm.broadcast(v.data(), 4, DType::kI32, 0);
  });
  EXPECT_NE(dtypes.find("broadcast of 4 float32"), std::string::npos) << dtypes;
  comm.shutdown();
}

TEST(CollectiveCheck, AgreeingCollectivesPassWithTheSameResults) {
  MpiCommunicator checked_comm(MPI_COMM_WORLD, checked());
  MpiCommunicator plain(MPI_COMM_WORLD, CollectiveOptions{});
  std::vector<int32_t> a(1000), b(1000);
  for (int i = 0; i < 1000; ++i) a[static_cast<size_t>(i)] = b[static_cast<size_t>(i)] = i * (checked_comm.rank() + 1);
  checked_comm.allreduce(a.data(), 1000, DType::kI32, ReduceOp::kSum);
  plain.allreduce(b.data(), 1000, DType::kI32, ReduceOp::kSum);
  EXPECT_EQ(a, b);
  checked_comm.barrier();
  checked_comm.shutdown();
  plain.shutdown();
}

}  // namespace
}  // namespace dtrain
