// DataLoader: the prefetch thread and the in-order hand-out of the batch ring.
// Batch b always lives in slot b % slots_.size(); the thread fills slots ahead of the one the
// caller holds and waits when the ring is full, so memory is fixed and order is kept.
#include "data/data_loader.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "core/memory.h"

namespace dtrain {

namespace {

// Bytes of a ring of `slots` batches (float pixels and an int32 label per sample), or -1 when
// the count overflows 64 bits.
int64_t ring_bytes(int64_t slots, int64_t batch_size, int64_t sample_numel) {
  int64_t bytes = 0;
  if (__builtin_mul_overflow(batch_size, sample_numel + 1, &bytes) || __builtin_mul_overflow(bytes, 4, &bytes) ||
      __builtin_mul_overflow(bytes, slots, &bytes))
    return -1;
  return bytes;
}

}  // namespace

DataLoader::DataLoader(const Dataset& dataset, int64_t batch_size, bool drop_last, int prefetch)
    : dataset_(dataset), batch_size_(batch_size), drop_last_(drop_last) {
  if (batch_size <= 0) throw Error(fmt::format("DataLoader: batch size must be positive, got {}", batch_size));
  if (prefetch < 1) throw Error(fmt::format("DataLoader: prefetch must be at least 1, got {}", prefetch));
  sample_shape_ = dataset.sample_shape();
  sample_numel_ = shape_numel(sample_shape_);
  const int64_t slots = int64_t{prefetch} + 1;
  const int64_t bytes = ring_bytes(slots, batch_size, sample_numel_), memory = host_memory_bytes();
  if (bytes < 0 || bytes > memory)
    throw Error(fmt::format("DataLoader: {} buffers of {} samples of shape {} need {}, more than this machine's {} "
                            "of memory",
                            slots, batch_size, shape_str(sample_shape_),
                            bytes < 0 ? "more than 2^63 bytes" : format_bytes(static_cast<double>(bytes)),
                            format_bytes(static_cast<double>(memory))),
                ErrorKind::kResources);
  Shape batch_shape = {batch_size};
  batch_shape.insert(batch_shape.end(), sample_shape_.begin(), sample_shape_.end());
  slots_.resize(static_cast<size_t>(prefetch) + 1);
  for (Slot& s : slots_) {
    s.images = Tensor::empty(batch_shape, Device::cpu(), DType::kF32);
    s.labels = Tensor::empty({batch_size}, Device::cpu(), DType::kI32);
    s.image_ptr = s.images.data();
    s.label_ptr = s.labels.data_as<int32_t>();
  }
  thread_ = std::thread([this] { run(); });
}

DataLoader::~DataLoader() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  producer_cv_.notify_all();
  thread_.join();
}

void DataLoader::start_epoch(std::vector<int64_t> indices) {
  const int64_t n = dataset_.size();
  for (size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] < 0 || indices[i] >= n)
      throw Error(fmt::format("DataLoader: index {} at position {} is out of range for a dataset of {} samples",
                              indices[i], i, n));
  }
  const auto count = static_cast<int64_t>(indices.size());
  auto shared = std::make_shared<const std::vector<int64_t>>(std::move(indices));
  {
    std::lock_guard lock(mu_);
    ++generation_;
    indices_ = std::move(shared);
    num_batches_ = drop_last_ ? count / batch_size_ : (count + batch_size_ - 1) / batch_size_;
    produced_ = 0;
    consumed_ = 0;
    held_ = -1;
    error_ = nullptr;
    error_batch_ = -1;
    // A slot being filled stays with the thread, which frees it on seeing the new generation.
    for (Slot& s : slots_) {
      if (s.state != SlotState::kFilling) s.state = SlotState::kFree;
    }
  }
  producer_cv_.notify_all();
}

bool DataLoader::next(Batch& out) {
  std::unique_lock lock(mu_);
  if (held_ >= 0) {
    slots_[static_cast<size_t>(held_)].state = SlotState::kFree;
    held_ = -1;
    producer_cv_.notify_all();
  }
  if (error_ && error_batch_ == consumed_) std::rethrow_exception(error_);
  if (consumed_ >= num_batches_) return false;
  const int index = static_cast<int>(consumed_ % static_cast<int64_t>(slots_.size()));
  Slot& s = slots_[static_cast<size_t>(index)];
  consumer_cv_.wait(lock, [&] {
    return (s.state == SlotState::kReady && s.batch == consumed_) || (error_ && error_batch_ == consumed_);
  });
  if (s.state != SlotState::kReady || s.batch != consumed_) std::rethrow_exception(error_);
  s.state = SlotState::kHeld;
  held_ = index;
  ++consumed_;
  if (s.size == batch_size_) {
    out.images = s.images;  // copy-assigns the handle: no allocation once `out` has a shape
    out.labels = s.labels;
  } else {
    Shape shape = s.images.shape();
    shape[0] = s.size;
    out.images = s.images.slice(0, shape);
    out.labels = s.labels.slice(0, {s.size});
  }
  out.size = s.size;
  return true;
}

int64_t DataLoader::num_batches() const {
  std::lock_guard lock(mu_);
  return num_batches_;
}

void DataLoader::run() {
  std::unique_lock lock(mu_);
  while (true) {
    producer_cv_.wait(lock, [&] { return stop_ || (produced_ < num_batches_ && !error_); });
    if (stop_) return;
    const uint64_t generation = generation_;
    const int64_t batch = produced_;
    Slot& s = slots_[static_cast<size_t>(batch % static_cast<int64_t>(slots_.size()))];
    producer_cv_.wait(lock, [&] { return stop_ || generation_ != generation || s.state == SlotState::kFree; });
    if (stop_) return;
    if (generation_ != generation) continue;
    s.state = SlotState::kFilling;
    std::shared_ptr<const std::vector<int64_t>> indices = indices_;
    std::exception_ptr error;
    lock.unlock();
    try {
      fill(s, *indices, batch);
    } catch (...) {
      error = std::current_exception();
    }
    indices.reset();
    lock.lock();
    if (generation_ != generation || error) {
      s.state = SlotState::kFree;
      if (generation_ == generation) {
        error_ = error;
        error_batch_ = batch;
        consumer_cv_.notify_all();
      }
      continue;
    }
    s.state = SlotState::kReady;
    s.batch = batch;
    ++produced_;
    consumer_cv_.notify_all();
  }
}

void DataLoader::fill(Slot& slot, const std::vector<int64_t>& indices, int64_t batch) {
  const int64_t begin = batch * batch_size_;
  const int64_t end = std::min(begin + batch_size_, static_cast<int64_t>(indices.size()));
  float* images = slot.image_ptr;
  for (int64_t i = begin; i < end; ++i) {
    if (i + 1 < end) dataset_.prefetch(indices[static_cast<size_t>(i + 1)]);
    slot.label_ptr[i - begin] = dataset_.get(indices[static_cast<size_t>(i)], images + (i - begin) * sample_numel_);
  }
  slot.size = end - begin;
}

}  // namespace dtrain
