// LmBatches: the language-model loop's data: the token shards of --data (data/token_shards.h),
// mmapped once per rank, the slot sampler, and one slot at a time staged on the device as
// inputs I32 [B, T] and targets I32 [B*T] (the same tokens shifted by one).
#pragma once

#include <cstdint>
#include <memory>

#include "app/train_config.h"
#include "comm/runtime.h"
#include "core/tensor.h"

namespace dtrain {

class LmBatches {
 public:
  // Opens and validates the shards (an error names the file: a data error); `batch` sequences of
  // `context` tokens per slot.
  LmBatches(const TrainConfig& config, Device device);
  LmBatches(LmBatches&&) noexcept;
  ~LmBatches();

  int64_t vocab() const { return vocab_; }
  int64_t train_tokens() const;
  int64_t val_tokens() const;
  int64_t val_slots() const;
  // Stages training slot number g of the run's slot order (shuffled per epoch or not), or
  // validation slot i (in order): inputs() and targets() hold it until the next call.
  void stage_train(int64_t g);
  // The slot of the training stream that counter g reads (what stage_train(g) stages).
  int64_t train_slot(int64_t g);  // not const: the sampler keeps the epoch's permutation
  void stage_val(int64_t i);
  const Tensor& inputs() const { return inputs_; }
  const Tensor& targets() const { return targets_; }

 private:
  struct Streams;
  void stage(bool val, int64_t slot);

  std::unique_ptr<Streams> streams_;
  int64_t batch_, context_, vocab_ = 0;
  Tensor host_inputs_, host_targets_;  // the slot on the host
  Tensor inputs_, targets_;            // on the device (the host tensors themselves on CPU)
};

// LmBatches on every rank, which maps the shards itself (nodes need not share a filesystem), and
// every rank learns every rank's verdict: one bad shard is one line (with the rank when the ranks
// saw different things) and every rank stops alike (AgreedError, a data error), with no
// MPI_Abort. A collective over runtime.control().
LmBatches open_lm_batches(Runtime& runtime, const TrainConfig& config);

}  // namespace dtrain
