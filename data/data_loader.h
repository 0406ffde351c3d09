// DataLoader: batches of a Dataset in a given index order, gathered by a background thread
// into a small ring of preallocated host buffers so the training step never waits on them.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/tensor.h"
#include "data/dataset.h"

namespace dtrain {

struct Batch {
  Tensor images;  // F32 [B, C, H, W] (B prepended to the dataset's sample_shape), host
  Tensor labels;  // I32 [B], host
  int64_t size = 0;
};

class DataLoader {
 public:
  // `dataset` must outlive the loader. `prefetch` batches are gathered ahead of the one the
  // caller holds. Throws dtrain::Error when batch_size <= 0 or prefetch < 1.
  DataLoader(const Dataset& dataset, int64_t batch_size, bool drop_last = false, int prefetch = 2);
  ~DataLoader();  // stops the thread, also mid-epoch
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Starts an epoch over `indices` (each in [0, dataset.size()), checked here), abandoning
  // whatever is left of the previous one.
  void start_epoch(std::vector<int64_t> indices);

  // The next batch in order; false when the epoch is done (or none was started). `out` shares
  // the loader's buffer, valid until the next call to next() or start_epoch(), which recycle it.
  // The last batch is smaller unless drop_last. An exception thrown while gathering a batch
  // (e.g. by Dataset::get) is rethrown here, in batch order, until the next start_epoch().
  // Call from one thread.
  bool next(Batch& out);

  // Batches in the current epoch (0 before the first start_epoch()).
  int64_t num_batches() const;
  int64_t batch_size() const { return batch_size_; }

 private:
  enum class SlotState { kFree, kFilling, kReady, kHeld };
  struct Slot {
    Tensor images;  // [batch_size, sample_shape...]
    Tensor labels;  // [batch_size]
    float* image_ptr = nullptr;
    int32_t* label_ptr = nullptr;
    SlotState state = SlotState::kFree;
    int64_t batch = -1;  // which batch of the epoch it holds when kReady/kHeld
    int64_t size = 0;
  };

  void run();
  void fill(Slot& slot, const std::vector<int64_t>& indices, int64_t batch);

  const Dataset& dataset_;
  const int64_t batch_size_;
  const bool drop_last_;
  Shape sample_shape_;
  int64_t sample_numel_ = 0;
  std::vector<Slot> slots_;  // prefetch + 1: the one the caller holds and those ahead of it

  mutable std::mutex mu_;
  std::condition_variable producer_cv_;
  std::condition_variable consumer_cv_;
  bool stop_ = false;
  uint64_t generation_ = 0;  // bumped by start_epoch so the thread drops stale work
  std::shared_ptr<const std::vector<int64_t>> indices_;
  int64_t num_batches_ = 0;
  int64_t produced_ = 0;  // next batch the thread gathers
  int64_t consumed_ = 0;  // next batch next() hands out
  int held_ = -1;         // slot the caller holds
  std::exception_ptr error_;
  int64_t error_batch_ = -1;
  std::thread thread_;  // last: starts after everything above is built
};

}  // namespace dtrain
