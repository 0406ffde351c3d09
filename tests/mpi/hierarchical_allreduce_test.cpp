// HierarchicalCommunicator against flat MPI_Allreduce (an MpiCommunicator without shared
// memory), side by side in one job: float32 and bf16, sum and average, sizes 0, 1, odd and
// multi-MB. With exact inputs (small integers) both must give the exact sum and the same bits;
// with inexact inputs every rank must still hold the same bits. Its reduce-scatter's blocks are
// the all-reduce's elements, bit for bit, and its all-gather works in place. At np 2 and 3 on one node the
// hierarchy is one node; on the test bed (tests/multinode, 2x1 and 2x2) it spans nodes. Tests
// use EXPECT between collectives so a failing rank still issues every collective its peers do.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "comm/exchange.h"
#include "comm/hierarchical_communicator.h"
#include "comm/mpi_communicator.h"
#include "core/error.h"
#include "core/kernels.h"
#include "tests/mpi/mpi_test_env.h"

namespace dtrain {
namespace {

using testing::test_comm;

// Both communicators live for the whole suite (made and freed where MPI may be called, with the
// test runtime's communicator idle).
class HierarchicalVsFlat : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    hier_ = std::make_unique<HierarchicalCommunicator>(MPI_COMM_WORLD).release();
    CollectiveOptions flat;
    flat.shared_memory_allreduce = false;
    flat_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, flat).release();
  }
  static void TearDownTestSuite() {
    hier_->shutdown();
    flat_->shutdown();
    delete hier_;
    delete flat_;
  }
  static HierarchicalCommunicator* hier_;
  static MpiCommunicator* flat_;
};
HierarchicalCommunicator* HierarchicalVsFlat::hier_ = nullptr;
MpiCommunicator* HierarchicalVsFlat::flat_ = nullptr;

// Integers in [-8, 8]: sums over a few ranks are exact in float32 and in bf16.
float exact_value(int rank, int64_t i) { return static_cast<float>((i * 5 + rank * 3) % 17 - 8); }

uint64_t fnv1a(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ static_cast<const uint8_t*>(data)[i]) * 1099511628211ull;
  return h;
}

bool identical_on_all_ranks(const void* data, size_t bytes) {
  const std::vector<uint64_t> all = allgather_values(test_comm(), fnv1a(data, bytes));
  for (uint64_t h : all)
    if (h != all[0]) return false;
  return true;
}

// A buffer of `n` elements of `dtype` (F32 or BF16) holding float values.
std::vector<uint8_t> make_buffer(DType dtype, int64_t n, float (*value)(int, int64_t), int rank) {
  std::vector<uint8_t> bytes(static_cast<size_t>(n) * dtype_size(dtype) + 1);  // +1: never empty
  for (int64_t i = 0; i < n; ++i) {
    const float v = value(rank, i);
    if (dtype == DType::kF32)
      std::memcpy(bytes.data() + i * 4, &v, 4);
    else {
      const uint16_t h = kernels::float_to_bf16(v);
      std::memcpy(bytes.data() + i * 2, &h, 2);
    }
  }
  return bytes;
}

float element(const std::vector<uint8_t>& bytes, DType dtype, int64_t i) {
  if (dtype == DType::kF32) {
    float v;
    std::memcpy(&v, bytes.data() + i * 4, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, bytes.data() + i * 2, 2);
  return kernels::bf16_to_float(h);
}

struct Case {
  DType dtype;
  int64_t count;
};

class HierarchicalSizes : public HierarchicalVsFlat, public ::testing::WithParamInterface<Case> {};

TEST_P(HierarchicalSizes, ExactSumAndAverageWithFlatsBitsOnEveryRank) {
  const auto [dtype, n] = GetParam();
  const int rank = test_comm().rank(), size = test_comm().size();
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    std::vector<uint8_t> hier = make_buffer(dtype, n, exact_value, rank), flat = hier;
    hier_->allreduce(hier.data(), n, dtype, op);
    flat_->allreduce(flat.data(), n, dtype, op);
    int64_t wrong = 0;
    for (int64_t i = 0; i < n && op == ReduceOp::kSum; ++i) {
      float expected = 0;
      for (int r = 0; r < size; ++r) expected += exact_value(r, i);
      wrong += element(hier, dtype, i) != expected;
    }
    const char* what = op == ReduceOp::kSum ? "sum" : "average";
    EXPECT_EQ(wrong, 0) << "hierarchical " << what << ": elements not the exact sum, of " << n;
    EXPECT_EQ(std::memcmp(hier.data(), flat.data(), hier.size()), 0) << "hierarchical and flat " << what << "s differ";
    EXPECT_TRUE(identical_on_all_ranks(hier.data(), hier.size())) << "hierarchical " << what << " differs between ranks";
  }
}

// 3M elements: 12 MB of float32, several blocks of the shared-memory slot and MPI's segments.
INSTANTIATE_TEST_SUITE_P(Comm, HierarchicalSizes,
                         ::testing::Values(Case{DType::kF32, 0}, Case{DType::kF32, 1}, Case{DType::kF32, 1023},
                                           Case{DType::kF32, 3 << 20}, Case{DType::kBF16, 0}, Case{DType::kBF16, 1},
                                           Case{DType::kBF16, 1023}, Case{DType::kBF16, 3 << 20}));

float noisy_value(int rank, int64_t i) {
  return 1.0f + static_cast<float>((i * 2654435761u + static_cast<uint64_t>(rank) * 40503u) % 1000003u) / 1000003.0f;
}

TEST_F(HierarchicalVsFlat, InexactSumsAreTheSameBitsOnEveryRank) {
  const int rank = test_comm().rank();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      std::vector<uint8_t> v = make_buffer(dtype, 100003, noisy_value, rank);
      hier_->allreduce(v.data(), 100003, dtype, op);
      EXPECT_TRUE(identical_on_all_ranks(v.data(), v.size())) << dtype_name(dtype);
    }
  }
}

TEST_F(HierarchicalVsFlat, SharedReduceBufferAndIntegers) {
  const int rank = test_comm().rank(), size = test_comm().size();
  Tensor buf = hier_->allocate_reduce_buffer(4099, DType::kF32, Device::cpu());
  float* p = buf.data_as<float>();
  for (int64_t i = 0; i < 4099; ++i) p[i] = exact_value(rank, i);
  std::vector<float> flat(p, p + 4099);
  hier_->allreduce(p, 4099, DType::kF32, ReduceOp::kAvg);
  flat_->allreduce(flat.data(), 4099, DType::kF32, ReduceOp::kAvg);
  EXPECT_EQ(std::memcmp(p, flat.data(), flat.size() * 4), 0) << "a node-shared buffer reduced differently";
  std::vector<int32_t> ints(33, rank + 1);
  hier_->allreduce(ints.data(), 33, DType::kI32, ReduceOp::kSum);
  for (int32_t v : ints) EXPECT_EQ(v, size * (size + 1) / 2);
}

TEST_F(HierarchicalVsFlat, OtherCollectivesRunOverTheWorldInOrder) {
  const int rank = test_comm().rank(), size = test_comm().size();
  std::vector<float> a(1000, static_cast<float>(rank)), b(7, static_cast<float>(rank));
  // Issued back to back, waited in reverse: they must still run in issue order.
  WorkHandle w1 = hier_->allreduce_async(a.data(), 1000, DType::kF32, ReduceOp::kSum);
  WorkHandle w2 = hier_->broadcast_async(b.data(), 7, DType::kF32, size - 1);
  std::vector<int32_t> gathered(static_cast<size_t>(size));
  int32_t mine = rank * 10;
  WorkHandle w3 = hier_->allgather_async(&mine, gathered.data(), 1, DType::kI32);
  w3->wait();
  w2->wait();
  w1->wait();
  hier_->barrier();
  EXPECT_EQ(a[999], static_cast<float>(size * (size - 1) / 2));
  EXPECT_EQ(b[0], static_cast<float>(size - 1));
  for (int r = 0; r < size; ++r) EXPECT_EQ(gathered[static_cast<size_t>(r)], r * 10);
  EXPECT_EQ(hier_->local_rank(), test_comm().local_rank());
  EXPECT_EQ(hier_->local_size(), test_comm().local_size());
}

// Note [Hierarchical reduce-scatter and all-gather]: each rank's block is, bit for bit, the
// hierarchical all-reduce's elements (inexact values), in place and out of place, float32 and
// bf16, sum and average; with exact values it is the flat MPI reduce-scatter's exact sum. `send`
// is left as it was.
TEST_F(HierarchicalVsFlat, ReduceScatterBlockIsTheAllreducesElements) {
  const int rank = test_comm().rank(), size = test_comm().size();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const size_t esize = dtype_size(dtype);
    for (int64_t n : {int64_t{1}, int64_t{1023}, int64_t{1 << 19}}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        const std::string what = fmt::format("{} n={} {}", dtype_name(dtype), n, op == ReduceOp::kSum ? "sum" : "avg");
        const std::vector<uint8_t> send = make_buffer(dtype, n * size, noisy_value, rank);
        std::vector<uint8_t> reduced = send, out(static_cast<size_t>(n) * esize), whole = send;
        hier_->allreduce(reduced.data(), n * size, dtype, op);
        hier_->reduce_scatter(send.data(), out.data(), n, dtype, op);
        uint8_t* mine = whole.data() + static_cast<size_t>(rank * n) * esize;
        hier_->reduce_scatter(whole.data(), mine, n, dtype, op);
        const uint8_t* want = reduced.data() + static_cast<size_t>(rank * n) * esize;
        EXPECT_EQ(std::memcmp(out.data(), want, out.size()), 0) << "out of place, " << what;
        EXPECT_EQ(std::memcmp(mine, want, out.size()), 0) << "in place, " << what;
        EXPECT_EQ(send, make_buffer(dtype, n * size, noisy_value, rank)) << "send changed, " << what;

        const std::vector<uint8_t> exact = make_buffer(dtype, n * size, exact_value, rank);
        std::vector<uint8_t> hier_out(out.size()), flat_out(out.size());
        hier_->reduce_scatter(exact.data(), hier_out.data(), n, dtype, op);
        flat_->reduce_scatter(exact.data(), flat_out.data(), n, dtype, op);
        EXPECT_EQ(hier_out, flat_out) << "exact values: hierarchical and flat differ, " << what;
      }
    }
  }
  std::vector<int32_t> ints(static_cast<size_t>(3 * size), rank + 1), got(3);
  hier_->reduce_scatter(ints.data(), got.data(), 3, DType::kI32, ReduceOp::kSum);
  EXPECT_EQ(got, std::vector<int32_t>(3, size * (size + 1) / 2));
  EXPECT_TRUE(hier_->reduce_scatter_async(nullptr, nullptr, 0, DType::kF32, ReduceOp::kSum)->test());
  EXPECT_THROW(hier_->reduce_scatter(ints.data(), got.data(), 3, DType::kI32, ReduceOp::kAvg), Error);
}

TEST_F(HierarchicalVsFlat, AllgatherInPlaceAndOutOfPlace) {
  const int rank = test_comm().rank(), size = test_comm().size();
  const int64_t n = 1001;
  std::vector<float> mine(static_cast<size_t>(n)), all(static_cast<size_t>(n * size), -1.f);
  for (int64_t i = 0; i < n; ++i) mine[static_cast<size_t>(i)] = exact_value(rank, i);
  hier_->allgather(mine.data(), all.data(), n, DType::kF32);
  std::vector<float> in_place(static_cast<size_t>(n * size), -1.f);
  std::copy(mine.begin(), mine.end(), in_place.begin() + rank * n);
  hier_->allgather(in_place.data() + rank * n, in_place.data(), n, DType::kF32);
  int64_t wrong = 0;
  for (int r = 0; r < size; ++r)
    for (int64_t i = 0; i < n; ++i) {
      wrong += all[static_cast<size_t>(r * n + i)] != exact_value(r, i);
      wrong += in_place[static_cast<size_t>(r * n + i)] != exact_value(r, i);
    }
  EXPECT_EQ(wrong, 0);
}

}  // namespace
}  // namespace dtrain
