// LmBatches: the language-model loop's data: the token shards of --data (data/token_shards.h),
// mmapped once per rank, the slot sampler, and one slot at a time staged on the device as
// inputs I32 [B, T] and targets I32 [B*T] (the same tokens shifted by one). On CUDA training
// slots go through a BatchStager (app/batch_stager.h): prefetch_train(g) copies slot g's tokens
// while the current step computes, and stage_train(g) then takes them; validation slots are
// copied when staged. On CPU the model reads the host buffer itself and nothing is copied.
#pragma once

#include <cstdint>
#include <memory>

#include "app/batch_stager.h"
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
  // Starts moving training slot number g to the device (CUDA; nothing on CPU): call it right after
  // stage_train of the slot before, with the g the next stage_train will ask for. A stage_train
  // of another g discards it and reads its own slot.
  void prefetch_train(int64_t g);
  // The slot of the training stream that counter g reads (what stage_train(g) stages).
  int64_t train_slot(int64_t g);  // not const: the sampler keeps the epoch's permutation
  void stage_val(int64_t i);
  const Tensor& inputs() const { return inputs_; }
  const Tensor& targets() const { return targets_; }

 private:
  struct Streams;
  void read(bool val, int64_t slot);  // into the host tensors

  std::unique_ptr<Streams> streams_;
  int64_t batch_, context_, vocab_ = 0;
  Tensor host_inputs_, host_targets_;  // the slot on the host
  Tensor inputs_, targets_;            // the staged slot on the device (the host tensors themselves on CPU)
  std::unique_ptr<BatchStager> stager_;  // CUDA: training slots
  int64_t prefetched_ = -1;              // the g staged in stager_ and not yet taken (-1: none)
  Tensor val_inputs_, val_targets_;      // CUDA: validation slots' device buffers
};

// LmBatches on every rank, which maps the shards itself (nodes need not share a filesystem), and
// every rank learns every rank's verdict: one bad shard is one line (with the rank when the ranks
// saw different things) and every rank stops alike (AgreedError, a data error), with no
// MPI_Abort. A collective over runtime.control().
LmBatches open_lm_batches(Runtime& runtime, const TrainConfig& config);

}  // namespace dtrain
