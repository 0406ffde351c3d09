// MpiCommunicator collectives at 2 and 3 ranks: allreduce (sum/avg; F32, I32, BF16, F16; sizes
// 0, 1, odd, multi-MB; sync and several async in flight), broadcast, allgather, barrier, and
// results bitwise identical on every rank. Tests use EXPECT (not ASSERT) between collectives so
// a failing rank still issues every collective its peers do.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "comm/exchange.h"
#include "core/error.h"
#include "core/kernels.h"
#include "tests/mpi/collective_test_util.h"
#include "tests/mpi/mpi_test_env.h"

namespace dtrain {
namespace {

using testing::test_comm;

// Quarter-integers in [-10, 15]: every sum of up to a few ranks is exact in float32.
float exact_value(int rank, int64_t i) { return static_cast<float>((i * 7 + rank * 13) % 101) * 0.25f - 10.0f; }

std::vector<float> exact_values(int rank, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = exact_value(rank, i);
  return v;
}

float exact_sum(int size, int64_t i) {
  float s = 0;
  for (int r = 0; r < size; ++r) s += exact_value(r, i);
  return s;
}

// Values of similar magnitude (in [1, 2)) that are not exact, different on every rank.
std::vector<float> noisy_values(int rank, int64_t n) {
  std::mt19937 gen(1234u + static_cast<unsigned>(rank));
  std::uniform_real_distribution<float> dist(1.0f, 2.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

uint64_t fnv1a(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ static_cast<const uint8_t*>(data)[i]) * 1099511628211ull;
  return h;
}

// True when every rank holds the same bytes (compares hashes gathered from all ranks).
bool identical_on_all_ranks(const void* data, size_t bytes) {
  Communicator& comm = test_comm();
  uint64_t mine = fnv1a(data, bytes);
  std::vector<uint64_t> all(static_cast<size_t>(comm.size()));
  // Two I32 words per hash: the test needs only equality.
  comm.allgather(&mine, all.data(), 2, DType::kI32);
  for (uint64_t h : all)
    if (h != mine) return false;
  return true;
}

class AllreduceSizes : public ::testing::TestWithParam<int64_t> {};

TEST_P(AllreduceSizes, SumAndAvgF32AreExact) {
  Communicator& comm = test_comm();
  const int64_t n = GetParam();
  std::vector<float> sum = exact_values(comm.rank(), n), avg = sum;
  comm.allreduce(sum.data(), n, DType::kF32, ReduceOp::kSum);
  comm.allreduce(avg.data(), n, DType::kF32, ReduceOp::kAvg);
  int64_t sum_bad = 0, avg_bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    float expected = exact_sum(comm.size(), i);
    sum_bad += sum[i] != expected;
    avg_bad += avg[i] != expected / static_cast<float>(comm.size());
  }
  EXPECT_EQ(sum_bad, 0) << "elements with a wrong sum, of " << n;
  EXPECT_EQ(avg_bad, 0) << "elements with a wrong average, of " << n;
}

TEST_P(AllreduceSizes, SumI32) {
  Communicator& comm = test_comm();
  const int64_t n = GetParam();
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(i) * (comm.rank() + 1) - 5;
  comm.allreduce(v.data(), n, DType::kI32, ReduceOp::kSum);
  const int32_t ranks = comm.size(), rank_sum = ranks * (ranks + 1) / 2;
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += v[i] != static_cast<int32_t>(i) * rank_sum - 5 * ranks;
  EXPECT_EQ(bad, 0);
}

// 0, 1, odd, and 3M floats (12 MB: several chunks of Open MPI's ring/segmented algorithms).
INSTANTIATE_TEST_SUITE_P(Comm, AllreduceSizes, ::testing::Values(0, 1, 1023, 3 * 1024 * 1024));

TEST(Allreduce, CountZeroIsACompletedNoOp) {
  Communicator& comm = test_comm();
  float untouched = 42.0f;
  WorkHandle work = comm.allreduce_async(&untouched, 0, DType::kF32, ReduceOp::kSum);
  EXPECT_TRUE(work->test());
  work->wait();
  EXPECT_EQ(untouched, 42.0f);
  EXPECT_TRUE(comm.allreduce_async(nullptr, 0, DType::kBF16, ReduceOp::kAvg)->test());
}

TEST(Allreduce, AvgOnI32IsRejected) {
  int32_t v = 1;
  EXPECT_THROW(test_comm().allreduce(&v, 1, DType::kI32, ReduceOp::kAvg), Error);
}

TEST(Allreduce, SeveralInFlightWaitedInReverse) {
  Communicator& comm = test_comm();
  const int r = comm.rank(), p = comm.size();
  std::vector<float> a = exact_values(r, 1023), b = exact_values(r, 1 << 20), avg = exact_values(r, 77);
  std::vector<int32_t> c(5, r + 1);
  std::vector<float> bcast = r == 0 ? exact_values(0, 300) : std::vector<float>(300, -1.0f);
  std::vector<WorkHandle> works;
  works.push_back(comm.allreduce_async(a.data(), 1023, DType::kF32, ReduceOp::kSum));
  works.push_back(comm.allreduce_async(b.data(), 1 << 20, DType::kF32, ReduceOp::kSum));
  works.push_back(comm.broadcast_async(bcast.data(), 300, DType::kF32, 0));
  works.push_back(comm.allreduce_async(c.data(), 5, DType::kI32, ReduceOp::kSum));
  works.push_back(comm.allreduce_async(avg.data(), 77, DType::kF32, ReduceOp::kAvg));
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
  for (const WorkHandle& w : works) {
    EXPECT_TRUE(w->test());
    EXPECT_GT(w->started_ns(), 0);  // host times for traces
    EXPECT_LE(w->started_ns(), w->finished_ns());
  }
  for (size_t i = 1; i < works.size(); ++i) EXPECT_LE(works[i - 1]->finished_ns(), works[i]->started_ns());

  int64_t bad = 0;
  for (int64_t i = 0; i < 1023; ++i) bad += a[i] != exact_sum(p, i);
  for (int64_t i = 0; i < (1 << 20); ++i) bad += b[i] != exact_sum(p, i);
  for (int64_t i = 0; i < 300; ++i) bad += bcast[i] != exact_value(0, i);
  for (int64_t i = 0; i < 77; ++i) bad += avg[i] != exact_sum(p, i) / static_cast<float>(p);
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(c, std::vector<int32_t>(5, p * (p + 1) / 2));
}

TEST(Allreduce, F32ResultIsBitwiseIdenticalOnEveryRank) {
  Communicator& comm = test_comm();
  for (int64_t n : {int64_t{1023}, int64_t{3 * 1024 * 1024}}) {
    std::vector<float> sum = noisy_values(comm.rank(), n), avg = sum;
    comm.allreduce(sum.data(), n, DType::kF32, ReduceOp::kSum);
    comm.allreduce(avg.data(), n, DType::kF32, ReduceOp::kAvg);
    EXPECT_TRUE(identical_on_all_ranks(sum.data(), sum.size() * sizeof(float))) << "sum, n=" << n;
    EXPECT_TRUE(identical_on_all_ranks(avg.data(), avg.size() * sizeof(float))) << "avg, n=" << n;
  }
}

// 16-bit allreduce against the float32 allreduce of the same (rounded) inputs.
using testing::HalfCase;

class HalfAllreduce : public ::testing::TestWithParam<HalfCase> {};

TEST_P(HalfAllreduce, MatchesFloat32WithinToleranceAndIsIdenticalOnEveryRank) {
  Communicator& comm = test_comm();
  const HalfCase hc = GetParam();
  for (int64_t n : {int64_t{1}, int64_t{1023}, int64_t{1 << 20}}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      std::vector<float> ref = noisy_values(comm.rank(), n);
      std::vector<uint16_t> half(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        half[i] = hc.pack(ref[i]);
        ref[i] = hc.unpack(half[i]);  // the reference sums what was actually sent
      }
      comm.allreduce(ref.data(), n, DType::kF32, op);
      comm.allreduce(half.data(), n, hc.dtype, op);
      double worst = 0;
      for (int64_t i = 0; i < n; ++i)
        worst = std::max(worst, std::abs(static_cast<double>(hc.unpack(half[i])) - ref[i]) / std::abs(ref[i]));
      EXPECT_LE(worst, hc.rel_tol) << dtype_name(hc.dtype) << " n=" << n << (op == ReduceOp::kAvg ? " avg" : " sum");
      EXPECT_TRUE(identical_on_all_ranks(half.data(), half.size() * 2)) << dtype_name(hc.dtype) << " n=" << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Comm, HalfAllreduce,
                         ::testing::Values(HalfCase{DType::kBF16, kernels::float_to_bf16, kernels::bf16_to_float, 1e-2},
                                           HalfCase{DType::kF16, kernels::float_to_fp16, kernels::fp16_to_float, 1e-3}),
                         [](const auto& info) { return std::string(dtype_name(info.param.dtype)); });

TEST(Broadcast, FromRootZeroAndFromTheLastRank) {
  Communicator& comm = test_comm();
  for (int root : {0, comm.size() - 1}) {
    for (int64_t n : {int64_t{1}, int64_t{1023}, int64_t{3 * 1024 * 1024}}) {
      std::vector<float> v = comm.rank() == root ? noisy_values(root, n) : std::vector<float>(n, 0.0f);
      comm.broadcast(v.data(), n, DType::kF32, root);
      EXPECT_EQ(v, noisy_values(root, n)) << "root " << root << " n=" << n;
    }
    std::vector<uint16_t> words(513, static_cast<uint16_t>(comm.rank() == root ? 0xbeef : 0));
    comm.broadcast(words.data(), 513, DType::kBF16, root);
    EXPECT_EQ(words, std::vector<uint16_t>(513, 0xbeef)) << "bf16 from root " << root;
  }
}

TEST(Broadcast, TensorOverload) {
  Communicator& comm = test_comm();
  Tensor t = Tensor::from_vector(exact_values(comm.rank(), 10), {2, 5});
  comm.broadcast(t, comm.size() - 1);
  EXPECT_EQ(t.to_vector(), exact_values(comm.size() - 1, 10));
}

TEST(Broadcast, BadRootIsRejected) {
  float v = 0;
  EXPECT_THROW(test_comm().broadcast(&v, 1, DType::kF32, test_comm().size()), Error);
  EXPECT_THROW(test_comm().broadcast(&v, 1, DType::kF32, -1), Error);
}

TEST(Allgather, EveryRankReceivesEveryBlockInRankOrder) {
  Communicator& comm = test_comm();
  const int p = comm.size();
  for (int64_t n : {int64_t{1}, int64_t{1023}}) {
    std::vector<float> send = exact_values(comm.rank(), n), recv(static_cast<size_t>(n * p), -99.0f);
    comm.allgather(send.data(), recv.data(), n, DType::kF32);
    for (int r = 0; r < p; ++r)
      EXPECT_EQ(std::vector<float>(recv.begin() + r * n, recv.begin() + (r + 1) * n), exact_values(r, n))
          << "block " << r << " n=" << n;
  }
}

TEST(Allgather, InPlaceFromOwnBlock) {
  Communicator& comm = test_comm();
  const int p = comm.size(), n = 17;
  std::vector<int32_t> recv(static_cast<size_t>(n * p), -1);
  for (int i = 0; i < n; ++i) recv[comm.rank() * n + i] = comm.rank() * 100 + i;
  comm.allgather(recv.data() + comm.rank() * n, recv.data(), n, DType::kI32);
  int bad = 0;
  for (int r = 0; r < p; ++r)
    for (int i = 0; i < n; ++i) bad += recv[r * n + i] != r * 100 + i;
  EXPECT_EQ(bad, 0);
}

// After a barrier, every rank sees what every other rank did before it (a file each).
TEST(Barrier, OrdersSideEffectsAcrossRanks) {
  Communicator& comm = test_comm();
  int32_t token = comm.rank() == 0 ? static_cast<int32_t>(getpid()) : 0;
  comm.broadcast(&token, 1, DType::kI32, 0);
  auto marker = [&](int r) {
    return std::filesystem::temp_directory_path() / ("dtrain_barrier_" + std::to_string(token) + "_" + std::to_string(r));
  };
  std::ofstream(marker(comm.rank())) << "here";
  comm.barrier();
  int missing = 0;
  for (int r = 0; r < comm.size(); ++r) missing += !std::filesystem::exists(marker(r));
  EXPECT_EQ(missing, 0);
  comm.barrier_async()->wait();  // everyone has looked before anyone deletes
  std::filesystem::remove(marker(comm.rank()));
}

// Strings and records move as bytes: any length (empty, odd, longer than every other rank's),
// any content (zero bytes included), and every rank gets every rank's exactly.
TEST(Exchange, StringsAndValuesOfEveryRankArriveExactly) {
  Communicator& comm = test_comm();
  auto text_of = [](int r) {
    std::string s(static_cast<size_t>(r * 37), 'a');
    for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>((i * 31 + static_cast<size_t>(r)) % 256);
    return s;
  };
  const std::vector<std::string> all = allgather_strings(comm, text_of(comm.rank()));
  ASSERT_EQ(static_cast<int>(all.size()), comm.size());
  for (int r = 0; r < comm.size(); ++r) EXPECT_EQ(all[static_cast<size_t>(r)], text_of(r)) << "rank " << r;
  const std::string root("rank 0's\0text", 14);
  EXPECT_EQ(broadcast_string(comm, comm.rank() == 0 ? root : std::string("ignored")), root);
  EXPECT_EQ(broadcast_string(comm, comm.rank() == 0 ? std::string() : std::string("x")), "");
  struct Record {
    uint64_t id;
    int32_t rank;
  };
  const std::vector<Record> records = allgather_values(comm, Record{0x0123456789abcdefull + static_cast<uint64_t>(comm.rank()), comm.rank()});
  for (int r = 0; r < comm.size(); ++r) {
    EXPECT_EQ(records[static_cast<size_t>(r)].id, 0x0123456789abcdefull + static_cast<uint64_t>(r));
    EXPECT_EQ(records[static_cast<size_t>(r)].rank, r);
  }
}

}  // namespace
}  // namespace dtrain
