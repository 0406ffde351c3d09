#include "app/lm_batches.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "comm/exchange.h"
#include "core/error.h"
#include "train/root_broadcast.h"
#include "data/token_shards.h"
#include "data/token_slots.h"

namespace dtrain {

struct LmBatches::Streams {
  TokenShards shards;
  TokenSlotSampler train_slots;
  TokenSlotSampler val_slots;  // in order: validation slot i is slot i
};

LmBatches::~LmBatches() = default;
LmBatches::LmBatches(LmBatches&&) noexcept = default;

LmBatches::LmBatches(const TrainConfig& c, Device device) : batch_(c.batch_size), context_(c.lm->context) {
  const int64_t slot_tokens = checked_mul(batch_, context_, "--batch-size x --context");
  TokenShards shards = open_token_shards(c.data.dir, c.lm->vocab, slot_tokens);
  TokenSlotSampler train(shards.train.size(), slot_tokens, c.data.shuffle, c.seed);
  TokenSlotSampler val(shards.val.size(), slot_tokens, false);
  vocab_ = shards.vocab;
  streams_ = std::make_unique<Streams>(Streams{std::move(shards), std::move(train), std::move(val)});
  // Staged on the host, then copied (on CPU the host tensors are the model's inputs).
  host_inputs_ = Tensor::empty({batch_, context_}, Device::cpu(), DType::kI32);
  host_targets_ = Tensor::empty({slot_tokens}, Device::cpu(), DType::kI32);
  if (device.is_cpu()) {
    inputs_ = host_inputs_;
    targets_ = host_targets_;
  } else {
    stager_ = std::make_unique<BatchStager>(device);
    val_inputs_ = Tensor::empty({batch_, context_}, device, DType::kI32);
    val_targets_ = Tensor::empty({slot_tokens}, device, DType::kI32);
  }
}

int64_t LmBatches::train_tokens() const { return streams_->shards.train.size(); }
int64_t LmBatches::val_tokens() const { return streams_->shards.val.size(); }
int64_t LmBatches::val_slots() const { return streams_->val_slots.slots(); }

int64_t LmBatches::train_slot(int64_t g) { return streams_->train_slots.slot(g); }

void LmBatches::stage_train(int64_t g) {
  if (!stager_) {
    read(false, train_slot(g));
    return;
  }
  if (prefetched_ != g) {
    if (prefetched_ >= 0) stager_->take(inputs_, targets_);  // another slot's: discarded
    prefetch_train(g);
  }
  stager_->take(inputs_, targets_);  // the compute stream waits for its copy
  prefetched_ = -1;
}

void LmBatches::prefetch_train(int64_t g) {
  if (!stager_) return;  // CPU: the host buffer is the model's input, in use until the step ends
  DTRAIN_CHECK(prefetched_ < 0, "LmBatches: slot {} prefetched while slot {} waits", g, prefetched_);
  read(false, train_slot(g));
  stager_->stage({host_inputs_, host_targets_, batch_});  // copied out before it returns
  prefetched_ = g;
}

void LmBatches::stage_val(int64_t i) {
  read(true, i % streams_->val_slots.slots());
  if (!stager_) return;
  // Its own device buffers: the stager's may hold a prefetched training slot.
  val_inputs_.copy_from(host_inputs_);  // on the compute stream: ordered before the forward that reads it
  val_targets_.copy_from(host_targets_);
  inputs_ = val_inputs_;
  targets_ = val_targets_;
}

void LmBatches::read(bool val, int64_t slot) {
  const TokenSlotSampler& sampler = val ? streams_->val_slots : streams_->train_slots;
  const TokenStream& stream = val ? streams_->shards.val : streams_->shards.train;
  const auto n = static_cast<size_t>(host_targets_.numel());
  sampler.read(stream, slot, {host_inputs_.data_as<int32_t>(), n}, {host_targets_.data_as<int32_t>(), n});
}

LmBatches open_lm_batches(Runtime& rt, const TrainConfig& c) {
  std::optional<LmBatches> data;
  agreed_across_ranks(rt.control(), [&] {
    data.emplace(classify_errors(ErrorKind::kData, [&] { return LmBatches(c, rt.device()); }));
  });
  return std::move(*data);
}

}  // namespace dtrain
