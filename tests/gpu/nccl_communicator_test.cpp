// NcclCommunicator under mpirun (one GPU per rank): results of every collective and dtype
// (reduce-scatter and all-gather in place and out of place among them),
// and the stream ordering that lets callers skip host syncs. Skips on every rank, with the
// reason, when the node has fewer GPUs than local ranks.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "comm/nccl/nccl_communicator.h"
#include "core/cuda/cuda_backend.h"
#include "core/device_select.h"
#include "core/kernels.h"
#include "core/memory.h"
#include "core/ops.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "tests/mpi/mpi_test_env.h"

namespace dtrain {
namespace {

using dtrain::testing::test_comm;

class Nccl : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Communicator& world = test_comm();
    // Every rank must take the same branch, or one would wait in ncclCommInitRank forever.
    int32_t ok = cuda::device_count() >= world.local_size() ? 1 : 0;
    world.allreduce(&ok, 1, DType::kI32, ReduceOp::kSum);
    if (ok != world.size()) {
      skip_reason_ = new std::string(
          fmt::format("needs one GPU per local rank ({} local ranks; this rank sees {}{})", world.local_size(),
                      cuda::device_count(),
                      cuda::device_count_error().empty() ? "" : ": " + cuda::device_count_error()));
      return;
    }
    DeviceChoice choice = select_device(DeviceRequest::cuda(), world.local_rank(), world.local_size(), false);
    NcclOptions options;
    options.timeout = std::chrono::seconds(120);
    options.compute = &compute_stream(choice.device);
    nccl_ = new NcclCommunicator(world, choice.device, options);
  }
  static void TearDownTestSuite() {
    delete nccl_;
    nccl_ = nullptr;
    delete skip_reason_;
    skip_reason_ = nullptr;
  }
  void SetUp() override {
    if (!nccl_) GTEST_SKIP() << *skip_reason_;
  }

  static NcclCommunicator& nccl() { return *nccl_; }
  static Device gpu() { return nccl_->stream().device(); }
  static int rank() { return nccl_->rank(); }
  static int size() { return nccl_->size(); }

 private:
  static inline NcclCommunicator* nccl_ = nullptr;
  static inline std::string* skip_reason_ = nullptr;
};

// Values that stay exact in every dtype (small integers), different per rank.
std::vector<float> rank_values(int rank, int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<float>((i % 17) + 10 * rank);
  return v;
}

TEST_F(Nccl, IdentityMatchesTheBootstrapCommunicator) {
  EXPECT_EQ(nccl().rank(), test_comm().rank());
  EXPECT_EQ(nccl().size(), test_comm().size());
  EXPECT_EQ(nccl().local_rank(), test_comm().local_rank());
  EXPECT_EQ(nccl().backend(), "nccl");
  EXPECT_TRUE(gpu().is_cuda());
}

TEST_F(Nccl, AllreduceSumAndAvgFloat32) {
  const int n = 1000003;  // odd, and large enough for several NCCL chunks
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    Tensor t = Tensor::from_vector(rank_values(rank(), n), {n}, gpu());
    nccl().allreduce(t, op);
    std::vector<float> got = t.to_vector();
    for (int i = 0; i < n; i += 9973) {
      float sum = 0;
      for (int r = 0; r < size(); ++r) sum += rank_values(r, n)[i];
      const float want = op == ReduceOp::kSum ? sum : sum / static_cast<float>(size());
      ASSERT_FLOAT_EQ(got[i], want) << "i=" << i;
    }
  }
}

TEST_F(Nccl, AllreduceInSixteenBitAndIntegerTypes) {
  const int n = 4099;
  std::vector<float> want(n, 0.0f);
  for (int r = 0; r < size(); ++r) {
    std::vector<float> v = rank_values(r, n);
    for (int i = 0; i < n; ++i) want[i] += v[i];
  }
  const std::vector<float> mine = rank_values(rank(), n);
  Tensor src = Tensor::from_vector(mine, {n}, gpu());
  Tensor back = Tensor::empty({n}, gpu());
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    Tensor half = Tensor::empty({n}, gpu(), dtype);
    if (dtype == DType::kBF16) {
      launch(gpu(), n, kernels::PackBF16{half.data_as<uint16_t>(), src.data(), 1.0f});
    } else {
      launch(gpu(), n, kernels::PackFP16{half.data_as<uint16_t>(), src.data(), 1.0f});
    }
    // After the pack on the compute stream (the communicator orders nothing itself).
    allreduce_after(compute_stream(gpu()), nccl(), half.raw(), n, dtype, ReduceOp::kSum)->wait();
    if (dtype == DType::kBF16) {
      launch(gpu(), n, kernels::UnpackBF16{back.data(), half.data_as<uint16_t>()});
    } else {
      launch(gpu(), n, kernels::UnpackFP16{back.data(), half.data_as<uint16_t>()});
    }
    EXPECT_EQ(back.to_vector(), want) << dtype_name(dtype);  // small integers: exact in both
  }
  std::vector<int32_t> ints(n), got(n);
  for (int i = 0; i < n; ++i) ints[i] = i - 1000 + rank();
  void* d = device_alloc(gpu(), n * sizeof(int32_t));
  copy_bytes(d, gpu(), ints.data(), Device::cpu(), n * sizeof(int32_t));
  nccl().allreduce(d, n, DType::kI32, ReduceOp::kSum);
  copy_bytes(got.data(), Device::cpu(), d, gpu(), n * sizeof(int32_t));
  const int rank_sum = size() * (size() - 1) / 2;
  for (int i = 0; i < n; ++i) ASSERT_EQ(got[i], (i - 1000) * size() + rank_sum);
  device_free(gpu(), d, n * sizeof(int32_t));
}

TEST_F(Nccl, CollectiveSeesKernelsQueuedBeforeItAndComputeSeesItsResult) {
  // No host sync anywhere: fill -> allreduce must order on the comm stream after the fill
  // (allreduce_after: Note [Ordering a collective after its producer]), and scale must order
  // on the compute stream after the allreduce (Work::wait).
  const int n = 1 << 20;
  Tensor t = Tensor::empty({n}, gpu());
  fill(t, static_cast<float>(rank() + 1));
  WorkHandle work = allreduce_after(compute_stream(gpu()), nccl(), t.raw(), n, DType::kF32, ReduceOp::kSum);
  work->wait();
  scale(t, 2.0f);
  const float want = 2.0f * static_cast<float>(size() * (size() + 1) / 2);
  std::vector<float> got = t.to_vector();
  EXPECT_EQ(got.front(), want);
  EXPECT_EQ(got.back(), want);
  EXPECT_GT(work->started_ns(), 0);
}

TEST_F(Nccl, BroadcastFromEveryRoot) {
  const int n = 333;
  for (int root = 0; root < size(); ++root) {
    Tensor t = Tensor::from_vector(rank_values(rank(), n), {n}, gpu());
    nccl().broadcast(t, root);
    EXPECT_EQ(t.to_vector(), rank_values(root, n)) << "root " << root;
  }
}

TEST_F(Nccl, AllgatherConcatenatesInRankOrder) {
  const int n = 5;
  Tensor send = Tensor::from_vector(rank_values(rank(), n), {n}, gpu());
  Tensor recv = Tensor::empty({n * size()}, gpu());
  nccl().allgather(send.raw(), recv.raw(), n, DType::kF32);
  std::vector<float> want;
  for (int r = 0; r < size(); ++r) {
    std::vector<float> v = rank_values(r, n);
    want.insert(want.end(), v.begin(), v.end());
  }
  EXPECT_EQ(recv.to_vector(), want);
}

TEST_F(Nccl, AllgatherInPlaceFromOwnBlock) {
  const int n = 1001;
  std::vector<float> host(static_cast<size_t>(n * size()), -1.0f);
  const std::vector<float> mine = rank_values(rank(), n);
  std::copy(mine.begin(), mine.end(), host.begin() + rank() * n);
  Tensor recv = Tensor::from_vector(host, {n * size()}, gpu());
  float* own = recv.data() + rank() * n;
  nccl().allgather(own, recv.raw(), n, DType::kF32);
  std::vector<float> want;
  for (int r = 0; r < size(); ++r) {
    std::vector<float> v = rank_values(r, n);
    want.insert(want.end(), v.begin(), v.end());
  }
  EXPECT_EQ(recv.to_vector(), want);
}

// Rank r gets block r of `send` reduced over every rank: out of place, and in place (recv is
// this rank's block of send, NCCL's rule); sum and average; float32 and int32; small integers,
// so any order of the sum is exact.
TEST_F(Nccl, ReduceScatterSumAndAvgInPlaceAndOutOfPlace) {
  const int n = 100003;  // per rank: odd, several NCCL chunks
  auto want = [&](int i, ReduceOp op) {
    float sum = 0;
    for (int r = 0; r < size(); ++r) sum += rank_values(r, n * size())[static_cast<size_t>(rank() * n + i)];
    return op == ReduceOp::kSum ? sum : sum / static_cast<float>(size());
  };
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    Tensor send = Tensor::from_vector(rank_values(rank(), n * size()), {n * size()}, gpu());
    Tensor recv = Tensor::empty({n}, gpu());
    nccl().reduce_scatter(send.raw(), recv.raw(), n, DType::kF32, op);
    nccl().reduce_scatter(send.raw(), send.data() + rank() * n, n, DType::kF32, op);
    const std::vector<float> out = recv.to_vector(), in_place = send.to_vector();
    int64_t wrong = 0;
    // ncclAvg may scale before it sums (exact here at np 2, but not promised): a relative bound.
    auto off = [&](float got, float expected) { return std::abs(got - expected) > 1e-6f * std::abs(expected); };
    for (int i = 0; i < n; ++i) {
      wrong += off(out[static_cast<size_t>(i)], want(i, op));
      wrong += off(in_place[static_cast<size_t>(rank() * n + i)], want(i, op));
    }
    EXPECT_EQ(wrong, 0) << (op == ReduceOp::kSum ? "sum" : "avg");
  }
  const int m = 37;
  std::vector<int32_t> ints(static_cast<size_t>(m * size())), got(m);
  for (int i = 0; i < m * size(); ++i) ints[static_cast<size_t>(i)] = i + 100 * rank();
  void* d_send = device_alloc(gpu(), ints.size() * sizeof(int32_t));
  void* d_recv = device_alloc(gpu(), m * sizeof(int32_t));
  copy_bytes(d_send, gpu(), ints.data(), Device::cpu(), ints.size() * sizeof(int32_t));
  nccl().reduce_scatter(d_send, d_recv, m, DType::kI32, ReduceOp::kSum);
  copy_bytes(got.data(), Device::cpu(), d_recv, gpu(), m * sizeof(int32_t));
  for (int i = 0; i < m; ++i) ASSERT_EQ(got[i], (rank() * m + i) * size() + 100 * size() * (size() - 1) / 2);
  device_free(gpu(), d_send, ints.size() * sizeof(int32_t));
  device_free(gpu(), d_recv, m * sizeof(int32_t));
}

// ZeRO's pattern: reduce-scatter then all-gather of the blocks is the all-reduce.
TEST_F(Nccl, ReduceScatterThenAllgatherIsTheAllreduce) {
  const int n = 4096;
  Tensor a = Tensor::from_vector(rank_values(rank(), n * size()), {n * size()}, gpu());
  Tensor b = Tensor::from_vector(rank_values(rank(), n * size()), {n * size()}, gpu());
  nccl().allreduce(a, ReduceOp::kAvg);
  float* own = b.data() + rank() * n;
  nccl().reduce_scatter(b.raw(), own, n, DType::kF32, ReduceOp::kAvg);
  nccl().allgather(own, b.raw(), n, DType::kF32);
  EXPECT_EQ(b.to_vector(), a.to_vector());
}

TEST_F(Nccl, BarrierCompletesAndTestReportsIt) {
  WorkHandle w = nccl().barrier_async();
  w->wait();  // host-blocking for barriers
  EXPECT_TRUE(w->test());
  EXPECT_GE(w->finished_ns(), w->started_ns());
}

TEST_F(Nccl, HostBuffersAreRejectedBeforeAnythingIsIssued) {
  // Every rank makes the same mistake, so no rank is left inside a collective.
  std::vector<float> host(8, 1.0f);
  try {
    nccl().allreduce(host.data(), 8, DType::kF32, ReduceOp::kSum);
    FAIL() << "host buffer accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not GPU memory"), std::string::npos) << e.what();
  }
  nccl().barrier();  // the communicator still works
}

}  // namespace
}  // namespace dtrain
