// BatchStager on CUDA: over many double-buffered steps in the trainer's prefetch order (stage
// b+1 right after taking b, then use b), the device tensors hold exactly the host batch, even
// when the compute stream is still busy with the previous step while the next copy is queued
// (the copy must wait for it before refilling its buffer), when host batches are recycled
// right after stage(), and when a batch is smaller or larger than the ones before.
#include "app/batch_stager.h"

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "core/kernels.h"
#include "core/memory.h"
#include "core/stream.h"
#include "tests/gpu/gpu_test.h"
#include "tests/gpu/stream_kernels.h"

namespace dtrain {
namespace {

using GpuBatchStager = testing::GpuTest;

constexpr int64_t kSample = 28 * 28;
// ~10 ms of GPU time before each step reads its batch: without the stager's waits, the copy of
// a later batch would land in the buffer first. The assertion does not depend on the duration.
constexpr int64_t kSpinCycles = 20'000'000;

// Fills `b` (reused across calls, as the DataLoader reuses its buffers) with batch `tag`:
// pixel k of sample j is tag*1e5 + j*1000 + k (exact in float32); label j is tag*1000 + j.
void fill_batch(Batch& b, int64_t tag, int64_t size) {
  if (!b.images.defined() || b.images.dim(0) != size) {
    b.images = Tensor::empty({size, 1, 28, 28});
    b.labels = Tensor::empty({size}, Device::cpu(), DType::kI32);
  }
  b.size = size;
  for (int64_t j = 0; j < size; ++j) {
    for (int64_t k = 0; k < kSample; ++k)
      b.images.data()[j * kSample + k] = static_cast<float>(tag * 100000 + j * 1000 + k);
    b.labels.data_as<int32_t>()[j] = static_cast<int32_t>(tag * 1000 + j);
  }
}

TEST_F(GpuBatchStager, DeviceTensorsEqualTheHostBatchOverDoubleBufferedSteps) {
  BatchStager stager(gpu());
  ASSERT_TRUE(stager.copies());
  Stream& compute = compute_stream(gpu());
  int* flag = static_cast<int*>(device_alloc(gpu(), sizeof(int)));
  // Batch sizes: steady, a smaller one, then larger than all before (the buffers grow).
  const std::vector<int64_t> sizes = {64, 64, 64, 64, 64, 17, 64, 64, 100, 100, 64, 3};
  const int64_t steps = static_cast<int64_t>(sizes.size());
  std::vector<Tensor> snapshots;  // what each step's "forward" read, copied on the compute stream
  std::vector<Tensor> label_snapshots;
  Batch host;  // one host batch object, refilled every step like the loader's buffer
  fill_batch(host, 0, sizes[0]);
  stager.stage(host);
  for (int64_t b = 0; b < steps; ++b) {
    Tensor images, labels;
    stager.take(images, labels);
    if (b + 1 < steps) {  // prefetch: the host batch is recycled right away
      fill_batch(host, b + 1, sizes[static_cast<size_t>(b + 1)]);
      stager.stage(host);
    }
    ASSERT_EQ(images.shape(), (Shape{sizes[static_cast<size_t>(b)], 1, 28, 28}));
    ASSERT_EQ(labels.shape(), (Shape{sizes[static_cast<size_t>(b)]}));
    ASSERT_EQ(images.device(), gpu());
    // The step: busy on the compute stream, then read the batch with kernels (no host sync).
    testing::spin_then_store(compute.native(), flag, static_cast<int>(b), kSpinCycles);
    Tensor snap = Tensor::zeros({images.numel()}, gpu());
    launch(gpu(), images.numel(), kernels::Axpy{snap.data(), images.data(), 1.f});
    Tensor label_snap = Tensor::empty({labels.numel()}, gpu(), DType::kI32);
    copy_bytes(label_snap.raw(), gpu(), labels.raw(), gpu(), labels.nbytes());
    snapshots.push_back(snap);
    label_snapshots.push_back(label_snap);
  }
  for (int64_t b = 0; b < steps; ++b) {
    const int64_t size = sizes[static_cast<size_t>(b)];
    const std::vector<float> images = snapshots[static_cast<size_t>(b)].to_vector();
    std::vector<int32_t> labels(static_cast<size_t>(size));
    copy_bytes(labels.data(), Device::cpu(), label_snapshots[static_cast<size_t>(b)].raw(), gpu(),
               labels.size() * sizeof(int32_t));
    int64_t wrong = 0;
    for (int64_t j = 0; j < size; ++j) {
      for (int64_t k = 0; k < kSample; ++k)
        wrong += images[static_cast<size_t>(j * kSample + k)] != static_cast<float>(b * 100000 + j * 1000 + k);
      wrong += labels[static_cast<size_t>(j)] != b * 1000 + j;
    }
    EXPECT_EQ(wrong, 0) << "step " << b << ": the device batch differs from the host batch";
  }
  device_free(gpu(), flag, sizeof(int));
}

TEST_F(GpuBatchStager, ManyStepsWithoutWaitingKeepEveryBatchIntact) {
  // No spin and no host sync: the host runs far ahead, so both pinned buffers and both device
  // buffers are reused while earlier copies and steps are still queued.
  BatchStager stager(gpu());
  constexpr int64_t kSteps = 200, kBatch = 32;
  Tensor sums = Tensor::zeros({kBatch * kSample}, gpu());
  Batch host;
  fill_batch(host, 0, kBatch);
  stager.stage(host);
  for (int64_t b = 0; b < kSteps; ++b) {
    Tensor images, labels;
    stager.take(images, labels);
    if (b + 1 < kSteps) {
      fill_batch(host, b + 1, kBatch);
      stager.stage(host);
    }
    launch(gpu(), images.numel(), kernels::Axpy{sums.data(), images.data(), 1.f});
  }
  // The host repeats the kernels' float32 additions in the same order (x + 1*x is exact either
  // way), so any batch read from the wrong buffer or before its copy shows as a mismatch.
  const std::vector<float> got = sums.to_vector();
  int64_t wrong = 0;
  for (int64_t j = 0; j < kBatch; ++j)
    for (int64_t k = 0; k < kSample; ++k) {
      float want = 0;
      for (int64_t b = 0; b < kSteps; ++b) want += static_cast<float>(b * 100000 + j * 1000 + k);
      wrong += got[static_cast<size_t>(j * kSample + k)] != want;
    }
  EXPECT_EQ(wrong, 0);
}

// A language model's slots (app/lm_batches.h): I32 token ids [B, T] as the "images" and I32
// targets, double-buffered as above; the device buffers are I32 and hold the host's ids.
TEST_F(GpuBatchStager, TokenBatchesArriveAsInt32) {
  BatchStager stager(gpu());
  constexpr int64_t kB = 4, kT = 16, kSteps = 6;
  Batch host{Tensor::empty({kB, kT}, Device::cpu(), DType::kI32), Tensor::empty({kB * kT}, Device::cpu(), DType::kI32),
             kB};
  auto fill = [&](int64_t tag) {
    for (int64_t i = 0; i < kB * kT; ++i) {
      host.images.data_as<int32_t>()[i] = static_cast<int32_t>(tag * 1000 + i);
      host.labels.data_as<int32_t>()[i] = static_cast<int32_t>(tag * 1000 + i + 1);
    }
  };
  fill(0);
  stager.stage(host);
  for (int64_t b = 0; b < kSteps; ++b) {
    Tensor inputs, targets;
    stager.take(inputs, targets);
    if (b + 1 < kSteps) {
      fill(b + 1);
      stager.stage(host);
    }
    ASSERT_EQ(inputs.dtype(), DType::kI32);
    ASSERT_EQ(inputs.shape(), (Shape{kB, kT}));
    compute_stream(gpu()).synchronize();  // the compute stream waits for the copy (take())
    std::vector<int32_t> got(static_cast<size_t>(kB * kT)), got_targets(got.size());
    copy_bytes(got.data(), Device::cpu(), inputs.raw(), gpu(), inputs.nbytes());
    copy_bytes(got_targets.data(), Device::cpu(), targets.raw(), gpu(), targets.nbytes());
    for (int64_t i = 0; i < kB * kT; ++i) {
      ASSERT_EQ(got[static_cast<size_t>(i)], b * 1000 + i) << "step " << b;
      ASSERT_EQ(got_targets[static_cast<size_t>(i)], b * 1000 + i + 1) << "step " << b;
    }
  }
}

}  // namespace
}  // namespace dtrain
