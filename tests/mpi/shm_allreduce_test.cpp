// ShmAllreduce at 2 and 3 ranks: exact sums and averages for counts around the segment and slot
// boundaries (a tiny slot forces many blocks), the same bits on every rank for inexact data,
// agreement with MPI_Allreduce, and that MpiCommunicator uses it only when allowed. Runs on the
// main thread while the test communicator's thread is idle (MPI_THREAD_SERIALIZED holds).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi_communicator.h"
#include "comm/mpi_check.h"
#include "comm/shm_allreduce.h"
#include "core/error.h"
#include "tests/mpi/collective_test_util.h"
#include "tests/mpi/mpi_test_env.h"

namespace dtrain {
namespace {

using testing::world_rank;
using testing::world_size;

// Integers below 2^12: sums over a few ranks, and those sums divided by the rank count when
// every rank adds the same multiple, are exact in float32.
float exact_value(int rank, int64_t i) { return static_cast<float>(rank * 1000 + (i * 7) % 97); }

TEST(ShmAllreduce, SumAndAverageAreExactAcrossSegmentAndSlotBoundaries) {
  // 64-float slots, and no small path (Note [Small collectives]): every count through the slots.
  auto shm = ShmAllreduce::create(MPI_COMM_WORLD, 64 * sizeof(float), 0);
  ASSERT_NE(shm, nullptr);
  const int rank = world_rank(), size = world_size();
  for (int64_t n : {1, 2, 15, 16, 17, 47, 63, 64, 65, 128, 129, 1000}) {
    std::vector<float> sum(static_cast<size_t>(n)), avg(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) sum[i] = avg[i] = exact_value(rank, i);
    shm->allreduce(sum.data(), n, ReduceOp::kSum);
    shm->allreduce(avg.data(), n, ReduceOp::kAvg);
    int64_t bad_sum = 0, bad_avg = 0;
    for (int64_t i = 0; i < n; ++i) {
      float expect = 0;
      for (int r = 0; r < size; ++r) expect += exact_value(r, i);
      bad_sum += sum[i] != expect;
      bad_avg += avg[i] != expect / static_cast<float>(size);
    }
    EXPECT_EQ(bad_sum, 0) << "wrong sums of " << n;
    EXPECT_EQ(bad_avg, 0) << "wrong averages of " << n;
  }
  shm->release();
}

TEST(ShmAllreduce, RegionBuffersAreReducedWhereTheyLie) {
  auto shm = ShmAllreduce::create(MPI_COMM_WORLD, 64 * sizeof(float), 0);  // slots smaller than the buffer
  ASSERT_NE(shm, nullptr);
  const int rank = world_rank(), size = world_size();
  float* region = shm->allocate_region(1000);
  ASSERT_NE(region, nullptr);
  EXPECT_EQ(std::count(region, region + 1000, 0.f), 1000) << "a region starts zeroed";
  // A bucket at an offset inside the region, as the reducer's buffers are gradients' views.
  const int64_t offset = 100, n = 777;
  for (int64_t i = 0; i < n; ++i) region[offset + i] = exact_value(rank, i);
  shm->allreduce(region + offset, n, ReduceOp::kSum);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    float expect = 0;
    for (int r = 0; r < size; ++r) expect += exact_value(r, i);
    bad += region[offset + i] != expect;
  }
  EXPECT_EQ(bad, 0) << "wrong sums of " << n;
  EXPECT_EQ(std::count(region, region + offset, 0.f), offset) << "memory before the buffer changed";
  EXPECT_EQ(std::count(region + offset + n, region + 1000, 0.f), 1000 - offset - n) << "memory after it changed";
  shm->release();
}

TEST(ShmAllreduce, InexactSumsAreBitwiseEqualOnEveryRankAndMatchMpi) {
  auto shm = ShmAllreduce::create(MPI_COMM_WORLD, 1000 * sizeof(float));
  ASSERT_NE(shm, nullptr);
  const int rank = world_rank(), size = world_size();
  const int64_t n = 5003;  // several blocks, a ragged last one
  std::mt19937 gen(17u + static_cast<unsigned>(rank));
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> mine(static_cast<size_t>(n));
  for (auto& v : mine) v = dist(gen);
  std::vector<float> mpi = mine;
  shm->allreduce(mine.data(), n, ReduceOp::kSum);
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, mpi.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(static_cast<double>(mine[i]) - mpi[i]));
  EXPECT_LT(worst, 1e-5) << "largest difference from MPI_Allreduce";

  std::vector<float> all(static_cast<size_t>(n * size));
  MPI_CHECK(MPI_Allgather(mine.data(), static_cast<int>(n), MPI_FLOAT, all.data(), static_cast<int>(n), MPI_FLOAT,
                          MPI_COMM_WORLD));
  int64_t differ = 0;
  for (int r = 1; r < size; ++r)
    for (int64_t i = 0; i < n; ++i) differ += std::memcmp(&all[i], &all[r * n + i], sizeof(float)) != 0;
  EXPECT_EQ(differ, 0) << "elements whose bits differ between ranks";
  shm->release();
}

// Note [Small collectives]: all-reduces and all-gathers of up to kSmallFloats floats per rank
// go through two alternating halves and one meeting. They give exactly the bits the slot path
// gives (sums in rank order), on every rank, in place and out of place; and back-to-back with
// ranks arriving at random times, no rank reads a half its peer has already refilled for the
// next collective (a single buffer would be overwritten by a rank one collective ahead).
TEST(ShmAllreduce, SmallCollectivesHaveTheSlotPathsBitsAndNeverReadARefilledHalf) {
  auto small = ShmAllreduce::create(MPI_COMM_WORLD, 64 * sizeof(float));
  auto slots = ShmAllreduce::create(MPI_COMM_WORLD, 64 * sizeof(float), 0);
  ASSERT_NE(small, nullptr);
  ASSERT_NE(slots, nullptr);
  const int rank = world_rank(), size = world_size();
  std::mt19937 gen(5u + static_cast<unsigned>(rank));
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{81}, int64_t{256}, ShmAllreduce::kSmallFloats}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      std::vector<float> a(static_cast<size_t>(n));
      for (auto& v : a) v = dist(gen);
      std::vector<float> b = a;
      const int64_t before = small->reductions();
      small->allreduce(a.data(), n, op);
      slots->allreduce(b.data(), n, op);
      EXPECT_EQ(small->reductions() - before, 1);
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "all-reduce of " << n;
      std::vector<float> all(static_cast<size_t>(n * size));
      MPI_Allgather(a.data(), static_cast<int>(n), MPI_FLOAT, all.data(), static_cast<int>(n), MPI_FLOAT,
                    MPI_COMM_WORLD);
      for (int r = 1; r < size; ++r)
        EXPECT_EQ(std::memcmp(all.data(), all.data() + r * n, static_cast<size_t>(n) * sizeof(float)), 0)
            << "ranks 0 and " << r << " differ after the all-reduce of " << n;
    }
    std::vector<float> mine(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) mine[i] = exact_value(rank, i);
    std::vector<float> out(static_cast<size_t>(n * size), -1.f), in_place(static_cast<size_t>(n * size), -1.f);
    std::copy(mine.begin(), mine.end(), in_place.begin() + rank * n);
    small->allgather(mine.data(), out.data(), n);
    small->allgather(in_place.data() + rank * n, in_place.data(), n);
    int64_t bad = 0;
    for (int r = 0; r < size; ++r)
      for (int64_t i = 0; i < n; ++i) bad += (out[r * n + i] != exact_value(r, i)) + (in_place[r * n + i] != exact_value(r, i));
    EXPECT_EQ(bad, 0) << "all-gather of " << n;
  }
  // Back to back, each rank sometimes late: every value read is the one its sender wrote for this
  // round.
  std::uniform_int_distribution<int> late(0, 3);
  const int64_t n = 256;
  int64_t wrong = 0;
  for (int round = 0; round < 3000; ++round) {
    if (late(gen) == 0) std::this_thread::sleep_for(std::chrono::microseconds(20));
    std::vector<float> mine(static_cast<size_t>(n)), all(static_cast<size_t>(n * size));
    for (int64_t i = 0; i < n; ++i) mine[i] = static_cast<float>(round * 8 + rank) + static_cast<float>(i) / 1024.f;
    small->allgather(mine.data(), all.data(), n);
    for (int r = 0; r < size; ++r)
      for (int64_t i = 0; i < n; ++i)
        wrong += all[r * n + i] != static_cast<float>(round * 8 + r) + static_cast<float>(i) / 1024.f;
    std::vector<float> sum(static_cast<size_t>(n), static_cast<float>(round + rank));
    small->allreduce(sum.data(), n, ReduceOp::kSum);
    float expect = 0;
    for (int r = 0; r < size; ++r) expect += static_cast<float>(round + r);
    wrong += std::count_if(sum.begin(), sum.end(), [&](float v) { return v != expect; });
  }
  EXPECT_EQ(wrong, 0) << "values read from a half refilled for a later collective";
  small->release();
  slots->release();
}

// Note [Ranks meet on flags]: a rank that arrives late wakes the ranks asleep on its meeting
// number. The last rank arrives 2 ms late (20 times the spin budget) at each of 60 meetings, so
// every other rank sleeps in the futex each time; a wake-up that is lost (no FUTEX_WAKE, or one on
// the wrong word) would still let the sleeper go on after the futex's 10 ms timeout, a stall that
// no result shows, so the test counts the sleeps that ended by the timeout: at most a few (a late
// rank descheduled for 8 ms more on a loaded machine), where a lost wake-up makes every one.
TEST(ShmAllreduce, ALateRankWakesTheRanksAsleepOnItsMeetingNumber) {
  auto shm = ShmAllreduce::create(MPI_COMM_WORLD, 64 * sizeof(float));
  ASSERT_NE(shm, nullptr);
  const int rank = world_rank(), size = world_size();
  const bool late = rank == size - 1;
  constexpr int kMeetings = 60;
  for (int m = 0; m < kMeetings; ++m) {
    if (late) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    float value = 1.f;
    shm->allreduce(&value, 1, ReduceOp::kSum);  // the small path: one meeting
    EXPECT_EQ(value, static_cast<float>(size));
  }
  // Over the ranks that waited.
  const int64_t mine[2] = {late ? 0 : shm->futex_sleeps(), late ? 0 : shm->futex_timeouts()};
  int64_t all[2] = {0, 0};
  MPI_CHECK(MPI_Allreduce(mine, all, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
  const int64_t waiters = size - 1;
  if (rank == 0)
    std::printf("%lld futex sleeps in %lld waits, %lld ended by the timeout\n", static_cast<long long>(all[0]),
                static_cast<long long>(waiters * kMeetings), static_cast<long long>(all[1]));
  EXPECT_GE(all[0], waiters * kMeetings / 2) << "the waiting ranks did not sleep: the test tests nothing";
  // Relative to the sleeps: on a loaded machine the late rank may itself be descheduled past the
  // 10 ms now and then; lost wake-ups make every sleep end by the timeout.
  EXPECT_LE(all[1], all[0] / 4) << "futex sleeps ended by the 10 ms timeout, not by the late rank's wake-up";
  shm->release();
}

TEST(ShmAllreduce, CommunicatorUsesItOnOneNodeUnlessTurnedOff) {
  // Every rank of this test runs on one node (mpirun -np N on the CI machine).
  ASSERT_EQ(testing::test_comm().local_size(), testing::test_comm().size());
  {
    MpiCommunicator on(MPI_COMM_WORLD);
    EXPECT_TRUE(on.shared_memory_allreduce());
    const int64_t before = on.shared_memory_reductions();
    std::vector<float> v(3000, 1.f);
    on.allreduce(v.data(), static_cast<int64_t>(v.size()), DType::kF32, ReduceOp::kSum);
    EXPECT_EQ(v.front(), static_cast<float>(world_size()));
    EXPECT_EQ(v.back(), static_cast<float>(world_size()));
    Tensor bucket = on.allocate_reduce_buffer(5000, DType::kF32, Device::cpu());  // in the shared window
    for (int64_t i = 0; i < bucket.numel(); ++i) bucket.data()[i] = exact_value(world_rank(), i);
    on.allreduce(bucket, ReduceOp::kAvg);
    float expect = 0;
    for (int r = 0; r < world_size(); ++r) expect += exact_value(r, 4321);
    EXPECT_EQ(bucket.data()[4321], expect / static_cast<float>(world_size()));
    EXPECT_EQ(on.shared_memory_reductions() - before, 2) << "float32 all-reduces that took the shared-memory path";
    // Types it does not handle take MPI's path.
    int32_t count = 1;
    on.allreduce(&count, 1, DType::kI32, ReduceOp::kSum);
    EXPECT_EQ(count, world_size());
    EXPECT_EQ(on.shared_memory_reductions() - before, 2);
    bucket = Tensor();
    on.shutdown();
  }
  setenv("DTRAIN_SHM_ALLREDUCE", "0", 1);
  MpiCommunicator off(MPI_COMM_WORLD);
  unsetenv("DTRAIN_SHM_ALLREDUCE");
  EXPECT_FALSE(off.shared_memory_allreduce());
  std::vector<float> v(3000, 1.f);
  off.allreduce(v.data(), static_cast<int64_t>(v.size()), DType::kF32, ReduceOp::kSum);
  EXPECT_EQ(v.front(), static_cast<float>(world_size()));
  EXPECT_EQ(off.shared_memory_reductions(), 0);
  off.shutdown();
}

// Ranks that issue different all-reduces (another size here, as ranks with other bucket caps
// would) fail with one error naming both, on every rank, instead of summing unrelated buffers
// or waiting forever.
TEST(ShmAllreduce, RanksInDifferentCollectivesFailOnEveryRank) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  ASSERT_TRUE(comm.shared_memory_allreduce());
  std::vector<float> same(64, 1.f);
  comm.allreduce(same.data(), 64, DType::kF32, ReduceOp::kSum);  // #1: alike on every rank
  const int64_t count = world_rank() == 0 ? 1000 : 500;
  std::vector<float> v(static_cast<size_t>(count), 1.f);
  std::string error;
  try {
    comm.allreduce(v.data(), count, DType::kF32, ReduceOp::kSum);
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("ranks issued different collectives"), std::string::npos) << error;
  EXPECT_NE(error.find(world_rank() == 0 ? "of 500 float32" : "of 1000 float32"), std::string::npos) << error;
  EXPECT_EQ(comm.flight_recorder().snapshot().back().state, CollectiveState::kFailed);
  comm.shutdown();
}

}  // namespace
}  // namespace dtrain
