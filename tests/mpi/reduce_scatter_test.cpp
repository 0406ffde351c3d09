// reduce_scatter (and the shared-memory all-gather ZeRO pairs it with) at 2 and 3 ranks, through the test runtime's communicator and through
// MpiCommunicators made here (with and without the shared-memory path): sums and averages per
// dtype, in place (recv is this rank's block of send, NCCL's rule) and out of place, count 0,
// bad arguments, the flight recorder's entry, ranks that issue different collectives (one error
// on every rank, no hang), and agreement with allreduce's elements. Tests use EXPECT (not
// ASSERT) between collectives so a failing rank still issues every collective its peers do.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <mpi.h>

#include "comm/mpi_communicator.h"
#include "comm/shm_allreduce.h"
#include "core/error.h"
#include "core/kernels.h"
#include "tests/mpi/collective_test_util.h"
#include "tests/mpi/mpi_test_env.h"

namespace dtrain {
namespace {

using testing::test_comm;

using testing::error_of;
using testing::HalfCase;

// Quarter-integers in [-10, 15]: every sum over a few ranks is exact in float32 (and in int32
// after scaling by 4), so sums in any order agree.
float exact_value(int rank, int64_t i) { return static_cast<float>((i * 7 + rank * 13) % 101) * 0.25f - 10.0f; }

float exact_sum(int size, int64_t i) {
  float s = 0;
  for (int r = 0; r < size; ++r) s += exact_value(r, i);
  return s;
}

// What rank `rank` sends: size blocks of n, element i of the whole buffer exact_value(rank, i).
std::vector<float> send_buffer(int rank, int size, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n * size));
  for (int64_t i = 0; i < n * size; ++i) v[static_cast<size_t>(i)] = exact_value(rank, i);
  return v;
}

// Elements of this rank's block that differ from the exact sum (or average).
int64_t wrong_elements(const float* got, int rank, int size, int64_t n, bool average) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float sum = exact_sum(size, rank * n + i);
    bad += got[i] != (average ? sum / static_cast<float>(size) : sum);
  }
  return bad;
}

// Spread over eight binades, different on every rank: a sum's bits depend on its order.
std::vector<float> order_sensitive_values(int rank, int64_t n, unsigned seed) {
  std::mt19937 gen(seed + 977u * static_cast<unsigned>(rank));
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-4, 4);
  std::uniform_int_distribution<int> sign(0, 1);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = std::ldexp(mantissa(gen), exponent(gen)) * (sign(gen) ? 1.f : -1.f);
  return v;
}

class ReduceScatterSizes : public ::testing::TestWithParam<int64_t> {};

TEST_P(ReduceScatterSizes, SumAndAvgF32OutOfPlaceAndInPlace) {
  Communicator& comm = test_comm();
  const int r = comm.rank(), p = comm.size();
  const int64_t n = GetParam();
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    const bool avg = op == ReduceOp::kAvg;
    const std::vector<float> send = send_buffer(r, p, n);
    std::vector<float> recv(static_cast<size_t>(n), -99.f);
    comm.reduce_scatter(send.data(), recv.data(), n, DType::kF32, op);
    EXPECT_EQ(wrong_elements(recv.data(), r, p, n, avg), 0) << "out of place, n=" << n << (avg ? " avg" : " sum");
    EXPECT_EQ(send, send_buffer(r, p, n)) << "out of place changed the send buffer";

    std::vector<float> whole = send_buffer(r, p, n);
    float* mine = whole.data() + r * n;
    comm.reduce_scatter(whole.data(), mine, n, DType::kF32, op);
    EXPECT_EQ(wrong_elements(mine, r, p, n, avg), 0) << "in place, n=" << n << (avg ? " avg" : " sum");
  }
}

// 1, odd, one not a multiple of the shared-memory path's 16-float segments, and 4 MB per rank
// (more than the 4 MB staging slot of every rank together: several rounds).
INSTANTIATE_TEST_SUITE_P(Comm, ReduceScatterSizes, ::testing::Values(1, 17, 1023, 1024 * 1024));

TEST(ReduceScatter, SumI32InPlaceAndOutOfPlace) {
  Communicator& comm = test_comm();
  const int r = comm.rank(), p = comm.size();
  const int64_t n = 301;
  std::vector<int32_t> send(static_cast<size_t>(n * p)), recv(static_cast<size_t>(n), -1);
  for (int64_t i = 0; i < n * p; ++i) send[static_cast<size_t>(i)] = static_cast<int32_t>(i) * (r + 1) - 5;
  std::vector<int32_t> whole = send;
  comm.reduce_scatter(send.data(), recv.data(), n, DType::kI32, ReduceOp::kSum);
  comm.reduce_scatter(whole.data(), whole.data() + r * n, n, DType::kI32, ReduceOp::kSum);
  const int32_t rank_sum = p * (p + 1) / 2;
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t expect = static_cast<int32_t>(r * n + i) * rank_sum - 5 * p;
    bad += recv[static_cast<size_t>(i)] != expect;
    bad += whole[static_cast<size_t>(r * n + i)] != expect;
  }
  EXPECT_EQ(bad, 0);
}

// 16-bit reduce-scatter against the float32 one of the same (rounded) inputs.

class HalfReduceScatter : public ::testing::TestWithParam<HalfCase> {};

TEST_P(HalfReduceScatter, MatchesFloat32WithinTolerance) {
  Communicator& comm = test_comm();
  const HalfCase hc = GetParam();
  const int r = comm.rank(), p = comm.size();
  const int64_t n = 1000;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    std::mt19937 gen(99u + static_cast<unsigned>(r));
    std::uniform_real_distribution<float> dist(1.0f, 2.0f);
    std::vector<float> ref(static_cast<size_t>(n * p));
    std::vector<uint16_t> half(ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      half[i] = hc.pack(dist(gen));
      ref[i] = hc.unpack(half[i]);  // the reference reduces what was actually sent
    }
    std::vector<float> ref_out(static_cast<size_t>(n));
    std::vector<uint16_t> half_out(static_cast<size_t>(n));
    comm.reduce_scatter(ref.data(), ref_out.data(), n, DType::kF32, op);
    comm.reduce_scatter(half.data(), half_out.data(), n, hc.dtype, op);
    double worst = 0;
    for (int64_t i = 0; i < n; ++i)
      worst = std::max(worst, std::abs(static_cast<double>(hc.unpack(half_out[i])) - ref_out[i]) / std::abs(ref_out[i]));
    EXPECT_LE(worst, hc.rel_tol) << dtype_name(hc.dtype) << (op == ReduceOp::kAvg ? " avg" : " sum");
  }
}

INSTANTIATE_TEST_SUITE_P(Comm, HalfReduceScatter,
                         ::testing::Values(HalfCase{DType::kBF16, kernels::float_to_bf16, kernels::bf16_to_float, 1e-2},
                                           HalfCase{DType::kF16, kernels::float_to_fp16, kernels::fp16_to_float, 1e-3}),
                         [](const auto& info) { return std::string(dtype_name(info.param.dtype)); });

TEST(ReduceScatter, CountZeroIsACompletedNoOp) {
  Communicator& comm = test_comm();
  float untouched = 42.0f;
  WorkHandle work = comm.reduce_scatter_async(&untouched, &untouched, 0, DType::kF32, ReduceOp::kSum);
  EXPECT_TRUE(work->test());
  work->wait();
  EXPECT_EQ(untouched, 42.0f);
  EXPECT_TRUE(comm.reduce_scatter_async(nullptr, nullptr, 0, DType::kBF16, ReduceOp::kAvg)->test());
}

TEST(ReduceScatter, BadArgumentsAreRejectedBeforeAnyCommunication) {
  Communicator& comm = test_comm();
  const int p = comm.size();
  std::vector<int32_t> v(static_cast<size_t>(4 * p), 1);
  std::vector<int32_t> out(4);
  EXPECT_THROW(comm.reduce_scatter(v.data(), out.data(), 4, DType::kI32, ReduceOp::kAvg), Error);
  EXPECT_THROW(comm.reduce_scatter(v.data(), out.data(), -1, DType::kI32, ReduceOp::kSum), Error);
  EXPECT_THROW(comm.reduce_scatter(nullptr, out.data(), 4, DType::kI32, ReduceOp::kSum), Error);
  // Inside `send` but not this rank's block: MPI forbids the aliasing, and NCCL's rule is not met.
  int32_t* wrong_block = v.data() + (comm.rank() + 1) % p * 4 + 1;
  EXPECT_THROW(comm.reduce_scatter(v.data(), wrong_block, 4, DType::kI32, ReduceOp::kSum), Error);
}

TEST(ReduceScatter, SeveralInFlightWithOtherCollectivesInIssueOrder) {
  Communicator& comm = test_comm();
  const int r = comm.rank(), p = comm.size();
  const int64_t n = 513;
  const std::vector<float> send = send_buffer(r, p, n);
  std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
  std::vector<float> all(static_cast<size_t>(n * p));
  std::vector<int32_t> c(3, r + 1);
  std::vector<WorkHandle> works;
  works.push_back(comm.reduce_scatter_async(send.data(), a.data(), n, DType::kF32, ReduceOp::kSum));
  works.push_back(comm.allreduce_async(c.data(), 3, DType::kI32, ReduceOp::kSum));
  works.push_back(comm.reduce_scatter_async(send.data(), b.data(), n, DType::kF32, ReduceOp::kAvg));
  works.push_back(comm.allgather_async(a.data(), all.data(), n, DType::kF32));  // waits on the first (issue order)
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
  EXPECT_EQ(wrong_elements(a.data(), r, p, n, false), 0);
  EXPECT_EQ(wrong_elements(b.data(), r, p, n, true), 0);
  EXPECT_EQ(c, std::vector<int32_t>(3, p * (p + 1) / 2));
  // reduce_scatter then allgather is an allreduce.
  int64_t bad = 0;
  for (int64_t i = 0; i < n * p; ++i) bad += all[static_cast<size_t>(i)] != exact_sum(p, i);
  EXPECT_EQ(bad, 0);
}

// With the shared-memory path off: MPI_Reduce_scatter_block, whose sums may be in another
// order than MPI_Allreduce's, but within float32 rounding of them.
TEST(ReduceScatter, MpiPathAgreesWithAllreduceWithinRounding) {
  setenv("DTRAIN_SHM_ALLREDUCE", "0", 1);
  MpiCommunicator comm(MPI_COMM_WORLD);
  unsetenv("DTRAIN_SHM_ALLREDUCE");
  EXPECT_FALSE(comm.shared_memory_allreduce());
  const int r = comm.rank(), p = comm.size();
  const int64_t n = 4099;
  // Relative to the sum of magnitudes: the scale of one rounding in any order of the sum.
  std::vector<double> magnitude(static_cast<size_t>(n), 0.0);
  for (int q = 0; q < p; ++q) {
    const std::vector<float> theirs = order_sensitive_values(q, n * p, 5);
    for (int64_t i = 0; i < n; ++i) magnitude[static_cast<size_t>(i)] += std::abs(theirs[static_cast<size_t>(r * n + i)]);
  }
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    std::vector<float> whole = order_sensitive_values(r, n * p, 5), reduced = whole;
    comm.allreduce(reduced.data(), n * p, DType::kF32, op);
    std::vector<float> out(static_cast<size_t>(n));
    comm.reduce_scatter(whole.data(), out.data(), n, DType::kF32, op);
    const double scale = op == ReduceOp::kAvg ? p : 1;
    double worst = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double want = reduced[static_cast<size_t>(r * n + i)];
      worst = std::max(worst, std::abs(out[static_cast<size_t>(i)] - want) * scale / magnitude[static_cast<size_t>(i)]);
    }
    EXPECT_LE(worst, 1e-6) << (op == ReduceOp::kAvg ? "avg" : "sum");
  }
  comm.shutdown();
}

TEST(ReduceScatter, FlightRecorderNamesTheKindAndTheCountPerRank) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int p = comm.size();
  std::vector<float> send(static_cast<size_t>(7 * p), 1.f), recv(7);
  comm.reduce_scatter(send.data(), recv.data(), 7, DType::kF32, ReduceOp::kSum);
  std::vector<int32_t> ints(static_cast<size_t>(5 * p), 1);
  comm.reduce_scatter(ints.data(), ints.data() + comm.rank() * 5, 5, DType::kI32, ReduceOp::kSum);
  const std::vector<CollectiveRecord> records = comm.flight_recorder().snapshot();
  ASSERT_GE(records.size(), 2u);
  const CollectiveRecord& f = records[records.size() - 2];
  const CollectiveRecord& i = records.back();
  EXPECT_EQ(f.kind, "reduce_scatter");
  EXPECT_EQ(f.count, 7);
  EXPECT_EQ(f.dtype, DType::kF32);
  EXPECT_EQ(f.state, CollectiveState::kCompleted);
  EXPECT_EQ(i.kind, "reduce_scatter");
  EXPECT_EQ(i.count, 5);
  EXPECT_EQ(i.dtype, DType::kI32);
  EXPECT_EQ(i.state, CollectiveState::kCompleted);
  EXPECT_EQ(recv, std::vector<float>(7, static_cast<float>(p)));
  comm.shutdown();
}

// --debug-collectives' header check: another count per rank is one error on every rank naming
// both, thrown before any data moved, and the communicator goes on working.
TEST(ReduceScatter, HeaderCheckCatchesDifferentCountsOnEveryRank) {
  CollectiveOptions options;
  options.timeout_s = 60;
  options.check_every_collective = true;
  MpiCommunicator comm(MPI_COMM_WORLD, options);
  const int r = comm.rank(), p = comm.size();
  std::vector<int32_t> send(static_cast<size_t>(6 * p), 1), recv(6);
  const int64_t count = r == 0 ? 4 : 6;
  const std::string error =
      error_of([&] { comm.reduce_scatter(send.data(), recv.data(), count, DType::kI32, ReduceOp::kSum); });
  EXPECT_NE(error.find("ranks issued different collectives at #1"), std::string::npos) << error;
  EXPECT_NE(error.find("rank 0: reduce_scatter of 4 int32"), std::string::npos) << error;
  EXPECT_NE(error.find(p == 2 ? "rank 1: reduce_scatter of 6 int32" : "ranks 1,2: reduce_scatter of 6 int32"),
            std::string::npos)
      << error;
  comm.reduce_scatter(send.data(), recv.data(), 6, DType::kI32, ReduceOp::kSum);
  EXPECT_EQ(recv, std::vector<int32_t>(6, p));
  comm.shutdown();
}

// Float32 on one node: the shared-memory path compares every rank's board entry once all have
// arrived, so a reduce-scatter against an all-reduce (or of another count) fails on every rank.
TEST(ReduceScatter, SharedMemoryPathCatchesAnotherCollectiveOnEveryRank) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int r = comm.rank(), p = comm.size();
  std::vector<float> buf(static_cast<size_t>(64 * p), 1.f), recv(64);
  comm.reduce_scatter(buf.data(), recv.data(), 64, DType::kF32, ReduceOp::kSum);  // alike on every rank
  const std::string counts = error_of([&] {
    comm.reduce_scatter(buf.data(), recv.data(), r == 0 ? 32 : 64, DType::kF32, ReduceOp::kSum);
  });
  EXPECT_NE(counts.find("ranks issued different collectives"), std::string::npos) << counts;
  EXPECT_NE(counts.find(r == 0 ? "reduce_scatter of 64 float32" : "reduce_scatter of 32 float32"), std::string::npos)
      << counts;
  const std::string kinds = error_of([&] {
    if (r == p - 1) comm.allreduce(buf.data(), 64, DType::kF32, ReduceOp::kSum);
    else comm.reduce_scatter(buf.data(), recv.data(), 64, DType::kF32, ReduceOp::kSum);
  });
  EXPECT_NE(kinds.find("ranks issued different collectives"), std::string::npos) << kinds;
  EXPECT_NE(kinds.find(r == p - 1 ? "reduce_scatter of 64 float32" : "allreduce of 64 float32"), std::string::npos)
      << kinds;
  comm.shutdown();
}

// Note [Reduce-scatter in all-reduce order] (comm/shm_allreduce.h): on one node, each rank's
// float32 block has exactly the bits the shared-memory all-reduce of the whole buffer gives
// those elements: through the communicator (staged buffers, several rounds for the larger one;
// a buffer in the node-shared window; in place and out of place; sum and average) and through
// ShmAllreduce with tiny slots (many rounds, ragged ends). The values make the order of the sum
// matter from 3 ranks on (checked first); at 2 ranks every order gives the same bits.
int64_t order_sensitive_elements(int size, int64_t n, unsigned seed) {
  std::vector<std::vector<float>> all;
  for (int q = 0; q < size; ++q) all.push_back(order_sensitive_values(q, n, seed));
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    float forward = all[0][static_cast<size_t>(i)] + all[1][static_cast<size_t>(i)], backward = all.back()[static_cast<size_t>(i)];
    for (int q = 2; q < size; ++q) forward += all[static_cast<size_t>(q)][static_cast<size_t>(i)];
    for (int q = size - 2; q >= 0; --q) backward += all[static_cast<size_t>(q)][static_cast<size_t>(i)];
    differ += std::memcmp(&forward, &backward, sizeof(float)) != 0;
  }
  return differ;
}

// Elements of this rank's block whose bits differ from the all-reduced buffer's.
int64_t bits_differ(const float* block, const std::vector<float>& reduced, int rank, int64_t n) {
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i)
    differ += std::memcmp(&block[i], &reduced[static_cast<size_t>(rank * n + i)], sizeof(float)) != 0;
  return differ;
}

TEST(ReduceScatter, SharedMemoryBlockIsBitwiseTheAllreducesElements) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  ASSERT_TRUE(comm.shared_memory_allreduce());  // every rank of this test is on one node
  const int r = comm.rank(), p = comm.size();
  if (p >= 3) {
    EXPECT_GT(order_sensitive_elements(p, 4096, 11), 400) << "values whose sum's bits depend on the order";
  }
  // 1000 * p: inside one round of the 4 MB slots; 1 M + 17 per rank: several rounds, ragged.
  for (int64_t n : {int64_t{1000}, int64_t{(1 << 20) + 17}}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      const char* what = op == ReduceOp::kAvg ? "avg" : "sum";
      const std::vector<float> send = order_sensitive_values(r, n * p, 11);
      std::vector<float> reduced = send;
      comm.allreduce(reduced.data(), n * p, DType::kF32, op);
      std::vector<float> out(static_cast<size_t>(n));
      comm.reduce_scatter(send.data(), out.data(), n, DType::kF32, op);
      EXPECT_EQ(bits_differ(out.data(), reduced, r, n), 0) << "out of place, n=" << n << " " << what;
      std::vector<float> whole = send;
      comm.reduce_scatter(whole.data(), whole.data() + r * n, n, DType::kF32, op);
      EXPECT_EQ(bits_differ(whole.data() + r * n, reduced, r, n), 0) << "in place, n=" << n << " " << what;
      // A buffer in the node-shared window (as the reducer's buckets are), at an offset.
      Tensor bucket = comm.allocate_reduce_buffer(n * p + 48, DType::kF32, Device::cpu());
      float* at = bucket.data() + 48;
      std::memcpy(at, send.data(), send.size() * sizeof(float));
      comm.reduce_scatter(at, out.data(), n, DType::kF32, op);
      EXPECT_EQ(bits_differ(out.data(), reduced, r, n), 0) << "shared window, out of place, n=" << n << " " << what;
      EXPECT_EQ(std::memcmp(at, send.data(), send.size() * sizeof(float)), 0) << "the send buffer changed";
      comm.reduce_scatter(at, at + r * n, n, DType::kF32, op);
      EXPECT_EQ(bits_differ(at + r * n, reduced, r, n), 0) << "shared window, in place, n=" << n << " " << what;
    }
  }
  EXPECT_GT(comm.shared_memory_reductions(), 0);
  comm.shutdown();
}

TEST(ReduceScatter, ShmReduceScatterIsBitwiseTheShmAllreduceWithTinySlots) {
  // 64 / p floats of each block a round; no small path (Note [Small collectives]): every count staged.
  auto shm = ShmAllreduce::create(MPI_COMM_WORLD, 64 * sizeof(float), 0);
  ASSERT_NE(shm, nullptr);
  const int r = testing::world_rank(), p = testing::world_size();
  for (int64_t n : {1, 5, 16, 21, 64, 100, 333}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      const std::vector<float> send = order_sensitive_values(r, n * p, 23);
      std::vector<float> reduced = send, out(static_cast<size_t>(n), -1.f);
      shm->allreduce(reduced.data(), n * p, op);
      shm->reduce_scatter(send.data(), out.data(), n, op);
      EXPECT_EQ(bits_differ(out.data(), reduced, r, n), 0) << "n=" << n << (op == ReduceOp::kAvg ? " avg" : " sum");
      std::vector<float> whole = send;
      shm->reduce_scatter(whole.data(), whole.data() + r * n, n, op);
      EXPECT_EQ(bits_differ(whole.data() + r * n, reduced, r, n), 0) << "in place, n=" << n;
      whole.erase(whole.begin() + r * n, whole.begin() + (r + 1) * n);
      std::vector<float> others = send;
      others.erase(others.begin() + r * n, others.begin() + (r + 1) * n);
      EXPECT_EQ(whole, others) << "in place changed the other blocks, n=" << n;
    }
  }
  shm->release();
}

// The shared-memory all-gather (float32 on one node): every block in rank order, bit for bit,
// in place and out of place, from staged buffers (several rounds of tiny slots, ragged) and
// into a node-shared window; reduce-scatter then all-gather is the all-reduce, bitwise.
TEST(Allgather, SharedMemoryPathIsExactInPlaceAndOutOfPlace) {
  auto shm = ShmAllreduce::create(MPI_COMM_WORLD, 64 * sizeof(float), 0);  // staged (small path: shm_allreduce_test)
  ASSERT_NE(shm, nullptr);
  const int r = testing::world_rank(), p = testing::world_size();
  for (int64_t n : {1, 5, 63, 64, 65, 200}) {
    const std::vector<float> mine = order_sensitive_values(r, n, 31);
    std::vector<float> want;
    for (int q = 0; q < p; ++q) {
      const std::vector<float> theirs = order_sensitive_values(q, n, 31);
      want.insert(want.end(), theirs.begin(), theirs.end());
    }
    std::vector<float> out(static_cast<size_t>(n * p), -1.f);
    shm->allgather(mine.data(), out.data(), n);
    EXPECT_EQ(std::memcmp(out.data(), want.data(), want.size() * sizeof(float)), 0) << "n=" << n;
    std::vector<float> in_place(static_cast<size_t>(n * p), -1.f);
    std::copy(mine.begin(), mine.end(), in_place.begin() + r * n);
    shm->allgather(in_place.data() + r * n, in_place.data(), n);
    EXPECT_EQ(std::memcmp(in_place.data(), want.data(), want.size() * sizeof(float)), 0) << "in place, n=" << n;
  }
  float* region = shm->allocate_region(16 + 300 * p);
  ASSERT_NE(region, nullptr);
  const std::vector<float> mine = order_sensitive_values(r, 300, 37);
  std::copy(mine.begin(), mine.end(), region + 16 + r * 300);
  shm->allgather(region + 16 + r * 300, region + 16, 300);  // in place, in the window
  int64_t wrong = 0;
  for (int q = 0; q < p; ++q) {
    const std::vector<float> theirs = order_sensitive_values(q, 300, 37);
    wrong += std::memcmp(region + 16 + q * 300, theirs.data(), 300 * sizeof(float)) != 0;
  }
  EXPECT_EQ(wrong, 0) << "blocks wrong in the window";
  std::vector<float> other = order_sensitive_values(r, 300, 41);
  shm->allgather(other.data(), region + 16, 300);  // out of place, into the window
  for (int q = 0; q < p; ++q) {
    const std::vector<float> theirs = order_sensitive_values(q, 300, 41);
    EXPECT_EQ(std::memcmp(region + 16 + q * 300, theirs.data(), 300 * sizeof(float)), 0) << "block " << q;
  }
  EXPECT_EQ(std::count(region, region + 16, 0.f), 16) << "memory before the buffer changed";
  shm->release();
}

TEST(Allgather, ReduceScatterThenAllgatherIsTheAllreduceBitwise) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  ASSERT_TRUE(comm.shared_memory_allreduce());
  const int r = comm.rank(), p = comm.size();
  const int64_t n = (1 << 20) + 3;  // several rounds of the 4 MB slots
  const std::vector<float> grads = order_sensitive_values(r, n * p, 43);
  std::vector<float> reduced = grads;
  comm.allreduce(reduced.data(), n * p, DType::kF32, ReduceOp::kAvg);
  const int64_t before = comm.shared_memory_reductions();
  std::vector<float> zero = grads;
  comm.reduce_scatter(zero.data(), zero.data() + r * n, n, DType::kF32, ReduceOp::kAvg);
  comm.allgather(zero.data() + r * n, zero.data(), n, DType::kF32);
  EXPECT_EQ(std::memcmp(zero.data(), reduced.data(), reduced.size() * sizeof(float)), 0);
  Tensor bucket = comm.allocate_reduce_buffer(n * p, DType::kF32, Device::cpu());
  std::memcpy(bucket.data(), grads.data(), grads.size() * sizeof(float));
  comm.reduce_scatter(bucket.data(), bucket.data() + r * n, n, DType::kF32, ReduceOp::kAvg);
  comm.allgather(bucket.data() + r * n, bucket.data(), n, DType::kF32);
  EXPECT_EQ(std::memcmp(bucket.data(), reduced.data(), reduced.size() * sizeof(float)), 0) << "in the window";
  EXPECT_EQ(comm.shared_memory_reductions() - before, 4) << "collectives that took the shared-memory path";
  std::vector<int32_t> ints(static_cast<size_t>(2 * p), 0);
  ints[static_cast<size_t>(2 * r)] = r;
  ints[static_cast<size_t>(2 * r + 1)] = -r;
  comm.allgather(ints.data() + 2 * r, ints.data(), 2, DType::kI32);  // not float32: MPI's path
  for (int q = 0; q < p; ++q) EXPECT_EQ(ints[static_cast<size_t>(2 * q + 1)], -q);
  EXPECT_EQ(comm.shared_memory_reductions() - before, 4);
  std::vector<float> f(static_cast<size_t>(64 * p), 1.f);
  const std::string error = error_of([&] {
    comm.allgather(f.data() + r * (r == 0 ? 32 : 64), f.data(), r == 0 ? 32 : 64, DType::kF32);
  });
  EXPECT_NE(error.find("ranks issued different collectives"), std::string::npos) << error;
  EXPECT_NE(error.find(r == 0 ? "allgather of 64 float32" : "allgather of 32 float32"), std::string::npos) << error;
  comm.shutdown();
}

}  // namespace
}  // namespace dtrain
