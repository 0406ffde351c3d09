// BatchStager on CPU: what take() returns is the batch that was staged, batch after batch, in
// the trainer's prefetch order (stage b+1 before using b) and in its CPU order over a
// DataLoader (fetch after use); misuse (take without stage, staging twice) is a clear error.
#include "app/batch_stager.h"

#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "data/data_loader.h"
#include "data/dataset.h"

namespace dtrain {
namespace {

// Batch `tag` of `size` samples of 2x3 pixels: pixel k of sample j is tag*1000 + j*10 + k;
// label j is tag*100 + j.
Batch make_batch(int64_t tag, int64_t size) {
  Batch b;
  b.size = size;
  b.images = Tensor::empty({size, 1, 2, 3});
  b.labels = Tensor::empty({size}, Device::cpu(), DType::kI32);
  for (int64_t j = 0; j < size; ++j) {
    for (int64_t k = 0; k < 6; ++k) b.images.data()[j * 6 + k] = static_cast<float>(tag * 1000 + j * 10 + k);
    b.labels.data_as<int32_t>()[j] = static_cast<int32_t>(tag * 100 + j);
  }
  return b;
}

void expect_batch(const Tensor& images, const Tensor& labels, int64_t tag, int64_t size) {
  ASSERT_EQ(images.shape(), (Shape{size, 1, 2, 3})) << "batch " << tag;
  ASSERT_EQ(labels.shape(), (Shape{size})) << "batch " << tag;
  ASSERT_EQ(labels.dtype(), DType::kI32);
  for (int64_t j = 0; j < size; ++j) {
    for (int64_t k = 0; k < 6; ++k)
      ASSERT_EQ(images.data()[j * 6 + k], static_cast<float>(tag * 1000 + j * 10 + k)) << "batch " << tag;
    ASSERT_EQ(labels.data_as<int32_t>()[j], tag * 100 + j) << "batch " << tag;
  }
}

TEST(BatchStager, CpuTakesBackTheStagedBatchesInPrefetchOrder) {
  BatchStager stager(Device::cpu());
  EXPECT_FALSE(stager.copies());
  const std::vector<int64_t> sizes = {4, 4, 4, 4, 1};  // a smaller last batch
  std::vector<Batch> host;
  for (size_t b = 0; b < sizes.size(); ++b) host.push_back(make_batch(static_cast<int64_t>(b), sizes[b]));

  stager.stage(host[0]);
  for (size_t b = 0; b < host.size(); ++b) {
    Tensor images, labels;
    stager.take(images, labels);
    if (b + 1 < host.size()) stager.stage(host[b + 1]);  // staged before batch b is used
    expect_batch(images, labels, static_cast<int64_t>(b), sizes[b]);
    EXPECT_TRUE(images.shares_storage(host[b].images)) << "CPU: no copy";
    EXPECT_TRUE(labels.shares_storage(host[b].labels));
  }
}

// Sample i: pixel k is i*10 + k, label i.
class CountingDataset : public Dataset {
 public:
  explicit CountingDataset(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  Shape sample_shape() const override { return {1, 2, 3}; }
  int num_classes() const override { return 10; }
  int32_t get(int64_t index, float* out) const override {
    for (int k = 0; k < 6; ++k) out[k] = static_cast<float>(index * 10 + k);
    return static_cast<int32_t>(index);
  }

 private:
  int64_t n_;
};

TEST(BatchStager, CpuOverADataLoaderSeesEverySampleOnce) {
  // The trainer's CPU order: take, use, then fetch the next batch (the loader recycles the
  // buffer the taken tensors live in at its next next()).
  CountingDataset data(23);
  DataLoader loader(data, 5);
  std::vector<int64_t> order;
  for (int64_t i = 0; i < data.size(); ++i) order.push_back((i * 7) % data.size());  // a permutation
  loader.start_epoch(order);
  BatchStager stager(Device::cpu());
  Batch batch;
  int64_t seen = 0;
  bool more = loader.next(batch);
  if (more) stager.stage(batch);
  while (more) {
    Tensor images, labels;
    stager.take(images, labels);
    ASSERT_EQ(images.dim(0), labels.numel());
    for (int64_t j = 0; j < labels.numel(); ++j, ++seen) {
      const int64_t index = order[static_cast<size_t>(seen)];
      ASSERT_EQ(labels.data_as<int32_t>()[j], index);
      for (int k = 0; k < 6; ++k) ASSERT_EQ(images.data()[j * 6 + k], static_cast<float>(index * 10 + k));
    }
    more = loader.next(batch);
    if (more) stager.stage(batch);
  }
  EXPECT_EQ(seen, data.size());
}

TEST(BatchStager, TakeWithoutStageAndStagingTwiceAreErrors) {
  BatchStager stager(Device::cpu());
  Tensor images, labels;
  EXPECT_THROW(stager.take(images, labels), Error);
  const Batch a = make_batch(1, 2), b = make_batch(2, 2);
  stager.stage(a);
  EXPECT_THROW(stager.stage(b), Error);  // would drop `a` unseen
  stager.take(images, labels);
  expect_batch(images, labels, 1, 2);
  EXPECT_THROW(stager.take(images, labels), Error);
  Batch on_wrong_type = make_batch(3, 2);
  on_wrong_type.labels = Tensor::empty({2});  // float labels
  EXPECT_THROW(stager.stage(on_wrong_type), Error);
}

}  // namespace
}  // namespace dtrain
