// DataLoader: every index once and in order, the right pixels and labels, partial and dropped
// last batches, fixed buffers, restarting and destroying mid-epoch, and errors from the thread.
#include "data/data_loader.h"

#include <atomic>
#include <chrono>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/memory.h"
#include "data/distributed_sampler.h"
#include "data/mnist.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;

// Sample i is 2x2 pixels of value i + k/10 (k the pixel) with label i % 10; optionally slow,
// throwing at one index, and counting calls.
class IndexDataset : public Dataset {
 public:
  explicit IndexDataset(int64_t n, int64_t throw_at = -1, std::chrono::microseconds delay = {})
      : n_(n), throw_at_(throw_at), delay_(delay) {}
  int64_t size() const override { return n_; }
  Shape sample_shape() const override { return {1, 2, 2}; }
  int num_classes() const override { return 10; }
  int32_t get(int64_t index, float* out) const override {
    ++calls;
    if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
    if (index == throw_at_) throw std::runtime_error("bad sample " + std::to_string(index));
    for (int k = 0; k < 4; ++k) out[k] = static_cast<float>(index) + 0.1f * static_cast<float>(k);
    return static_cast<int32_t>(index % 10);
  }
  mutable std::atomic<int64_t> calls{0};

 private:
  int64_t n_, throw_at_;
  std::chrono::microseconds delay_;
};

// The message of the dtrain::Error `f` throws ("" when none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Samples of any shape; never read (the loader is refused before it gathers anything).
class ShapeOnlyDataset : public Dataset {
 public:
  explicit ShapeOnlyDataset(Shape shape) : shape_(std::move(shape)) {}
  int64_t size() const override { return 1; }
  Shape sample_shape() const override { return shape_; }
  int num_classes() const override { return 10; }
  int32_t get(int64_t, float*) const override { return 0; }

 private:
  Shape shape_;
};

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

// Checks `batch` holds samples indices[begin, begin + batch.size) of an IndexDataset.
void expect_index_batch(const Batch& batch, const std::vector<int64_t>& indices, int64_t begin) {
  ASSERT_EQ(batch.images.dim(0), batch.size);
  ASSERT_EQ(batch.labels.dim(0), batch.size);
  const float* img = batch.images.data();
  const int32_t* lab = batch.labels.data_as<int32_t>();
  for (int64_t j = 0; j < batch.size; ++j) {
    int64_t want = indices[static_cast<size_t>(begin + j)];
    ASSERT_EQ(lab[j], want % 10) << "sample " << begin + j;
    for (int k = 0; k < 4; ++k) ASSERT_FLOAT_EQ(img[j * 4 + k], static_cast<float>(want) + 0.1f * k);
  }
}

TEST(DataLoader, YieldsEveryIndexOnceInOrder) {
  IndexDataset ds(100);
  DataLoader loader(ds, 8);
  std::vector<int64_t> order = seeded_permutation(100, 3);
  loader.start_epoch(order);
  EXPECT_EQ(loader.num_batches(), 13);
  Batch batch;
  int64_t seen = 0, batches = 0;
  while (loader.next(batch)) {
    EXPECT_EQ(batch.images.shape(), (Shape{batch.size, 1, 2, 2}));
    EXPECT_EQ(batch.images.dtype(), DType::kF32);
    EXPECT_EQ(batch.labels.dtype(), DType::kI32);
    EXPECT_TRUE(batch.images.device().is_cpu());
    expect_index_batch(batch, order, seen);
    seen += batch.size;
    ++batches;
    EXPECT_EQ(batch.size, batches < 13 ? 8 : 4) << "batch " << batches;
  }
  EXPECT_EQ(seen, 100);
  EXPECT_EQ(batches, 13);
  EXPECT_EQ(ds.calls.load(), 100) << "each sample gathered exactly once";
  EXPECT_FALSE(loader.next(batch)) << "stays done";
}

TEST(DataLoader, MatchesDatasetPixelsAndLabels) {
  const int64_t n = 50, rows = 28, cols = 28;
  std::vector<uint8_t> images(static_cast<size_t>(n * rows * cols)), labels(static_cast<size_t>(n));
  for (size_t i = 0; i < images.size(); ++i) images[i] = static_cast<uint8_t>((i * 131 + i / 7) % 256);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<uint8_t>((i * 3) % 10);
  MnistDataset ds(images, labels, rows, cols, Normalize{0.1307f, 0.3081f});
  DataLoader loader(ds, 16, false, 3);
  DistributedSampler sampler(n, 2, 1, true, 11);
  sampler.set_epoch(4);
  std::vector<int64_t> order = sampler.indices();
  loader.start_epoch(order);
  Batch batch;
  std::vector<float> want(static_cast<size_t>(rows * cols));
  int64_t pos = 0;
  while (loader.next(batch)) {
    ASSERT_EQ(batch.images.shape(), (Shape{batch.size, 1, rows, cols}));
    for (int64_t j = 0; j < batch.size; ++j, ++pos) {
      int32_t label = ds.get(order[static_cast<size_t>(pos)], want.data());
      EXPECT_EQ(batch.labels.data_as<int32_t>()[j], label);
      std::vector<float> got(batch.images.data() + j * rows * cols, batch.images.data() + (j + 1) * rows * cols);
      ASSERT_EQ(got, want) << "sample " << pos;
    }
  }
  EXPECT_EQ(pos, static_cast<int64_t>(order.size()));
}

TEST(DataLoader, DropLastSkipsThePartialBatch) {
  IndexDataset ds(100);
  DataLoader loader(ds, 8, true);
  loader.start_epoch(iota(100));
  EXPECT_EQ(loader.num_batches(), 12);
  Batch batch;
  int64_t batches = 0;
  while (loader.next(batch)) {
    EXPECT_EQ(batch.size, 8);
    expect_index_batch(batch, iota(100), batches * 8);
    ++batches;
  }
  EXPECT_EQ(batches, 12);
}

TEST(DataLoader, EpochsReuseTheSameBuffers) {
  IndexDataset ds(64);
  const int prefetch = 2;
  DataLoader loader(ds, 4, false, prefetch);
  std::set<const void*> buffers;
  Batch batch;
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> order = seeded_permutation(64, static_cast<uint64_t>(epoch));
    loader.start_epoch(order);
    int64_t pos = 0;
    while (loader.next(batch)) {
      expect_index_batch(batch, order, pos);
      pos += batch.size;
      buffers.insert(batch.images.raw());
    }
    EXPECT_EQ(pos, 64);
  }
  EXPECT_LE(buffers.size(), static_cast<size_t>(prefetch + 1)) << "a fixed ring, not a buffer per batch";
}

TEST(DataLoader, HeldBatchSurvivesPrefetchAndPrefetchIsBounded) {
  IndexDataset ds(100);
  const int prefetch = 2;
  const int64_t b = 5;
  DataLoader loader(ds, b, false, prefetch);
  loader.start_epoch(iota(100));
  Batch first;
  ASSERT_TRUE(loader.next(first));
  // Wait (bounded) until the thread has filled the ring; it must then stop, and batch 0
  // must still be intact.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (ds.calls.load() < b * (1 + prefetch) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  ASSERT_EQ(ds.calls.load(), b * (1 + prefetch));
  expect_index_batch(first, iota(100), 0);
  Batch second;
  ASSERT_TRUE(loader.next(second));
  expect_index_batch(second, iota(100), b);
}

TEST(DataLoader, StartEpochMidEpochAbandonsTheRest) {
  IndexDataset ds(200, -1, std::chrono::microseconds(50));
  DataLoader loader(ds, 10);
  loader.start_epoch(iota(200));
  Batch batch;
  ASSERT_TRUE(loader.next(batch));
  ASSERT_TRUE(loader.next(batch));
  std::vector<int64_t> second = seeded_permutation(200, 99);
  second.resize(35);
  loader.start_epoch(second);
  EXPECT_EQ(loader.num_batches(), 4);
  int64_t pos = 0;
  while (loader.next(batch)) {
    expect_index_batch(batch, second, pos);
    pos += batch.size;
  }
  EXPECT_EQ(pos, 35);
}

TEST(DataLoader, DestructionMidEpochDoesNotHang) {
  IndexDataset slow(1000, -1, std::chrono::microseconds(200));
  {
    DataLoader loader(slow, 16);
    loader.start_epoch(iota(1000));
    Batch batch;
    ASSERT_TRUE(loader.next(batch));
  }
  {
    DataLoader loader(slow, 16);
    loader.start_epoch(iota(1000));  // destroyed while the first batch is being gathered
  }
  {
    DataLoader never_started(slow, 16);
  }
  SUCCEED();
}

TEST(DataLoader, ExceptionsReachNextInBatchOrder) {
  IndexDataset ds(100, 37);
  DataLoader loader(ds, 8);
  loader.start_epoch(iota(100));
  Batch batch;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(loader.next(batch)) << "batches before the bad sample arrive";
    expect_index_batch(batch, iota(100), i * 8);
  }
  try {
    loader.next(batch);
    FAIL() << "expected the dataset's exception";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("bad sample 37"));
  }
  EXPECT_THROW(loader.next(batch), std::runtime_error) << "the loader stays failed";
  std::vector<int64_t> good = {1, 2, 3, 38, 39};
  loader.start_epoch(good);
  ASSERT_TRUE(loader.next(batch));
  expect_index_batch(batch, good, 0);
  EXPECT_FALSE(loader.next(batch));
}

TEST(DataLoader, ValidatesArguments) {
  IndexDataset ds(10);
  EXPECT_THROW(DataLoader(ds, 0), Error);
  EXPECT_THROW(DataLoader(ds, -3), Error);
  EXPECT_THROW(DataLoader(ds, 4, false, 0), Error);
  DataLoader loader(ds, 4);
  Batch batch;
  EXPECT_FALSE(loader.next(batch)) << "no epoch started";
  EXPECT_EQ(loader.num_batches(), 0);
  try {
    loader.start_epoch({1, 2, 10});
    FAIL() << "expected an out-of-range error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("index 10 at position 2 is out of range for a dataset of 10 samples"));
  }
  loader.start_epoch({});
  EXPECT_EQ(loader.num_batches(), 0);
  EXPECT_FALSE(loader.next(batch));
}

// The issue's --batch-size 4611686018427387905 wrapped the batch's element count to 784: the
// loader must refuse a ring whose size overflows, or cannot fit in memory, before allocating.
TEST(DataLoader, RefusesBatchBuffersThatOverflowOrCannotFit) {
  std::string msg = error_of([] {
    ShapeOnlyDataset ds({1, 28, 28});
    DataLoader loader(ds, 4611686018427387905);
  });
  EXPECT_EQ(msg, "DataLoader: 3 buffers of 4611686018427387905 samples of shape [1, 28, 28] need more than 2^63 bytes, "
                 "more than this machine's " +
                     format_bytes(static_cast<double>(host_memory_bytes())) + " of memory");
  msg = error_of([] {
    ShapeOnlyDataset ds({1, 1 << 20, 1 << 10});  // 4 GiB a sample
    DataLoader loader(ds, int64_t{1} << 20);      // 4 PiB a batch
  });
  EXPECT_THAT(msg, HasSubstr("DataLoader: 3 buffers of 1048576 samples of shape [1, 1048576, 1024] need 13510"));
  EXPECT_EQ(msg.find('\n'), std::string::npos);
}

}  // namespace
}  // namespace dtrain
