// TokenSlotSampler: slot arithmetic and the per-epoch shuffled order (Note [Token slots]).
#include "data/token_slots.h"

#include <fmt/format.h>

#include "core/error.h"
#include "data/distributed_sampler.h"

namespace dtrain {

TokenSlotSampler::TokenSlotSampler(int64_t stream_tokens, int64_t slot_tokens, bool shuffle, uint64_t seed)
    : slots_(0), slot_tokens_(slot_tokens), shuffle_(shuffle), seed_(seed) {
  DTRAIN_CHECK(slot_tokens >= 1, "a slot of {} tokens", slot_tokens);
  slots_ = stream_tokens > 0 ? (stream_tokens - 1) / slot_tokens : 0;
  if (slots_ < 1)
    throw Error(fmt::format("a stream of {} tokens holds no slot of {} tokens and its next token", stream_tokens,
                            slot_tokens),
                ErrorKind::kData);
}

int64_t TokenSlotSampler::slot(int64_t g) {
  DTRAIN_CHECK(g >= 0, "slot counter {} is negative", g);
  if (!shuffle_) return g % slots_;
  const int64_t epoch = g / slots_;
  if (epoch != epoch_) {
    order_ = seeded_permutation(slots_, seed_ + static_cast<uint64_t>(epoch));
    epoch_ = epoch;
  }
  return order_[static_cast<size_t>(g % slots_)];
}

void TokenSlotSampler::read(const TokenStream& stream, int64_t slot, std::span<int32_t> inputs,
                            std::span<int32_t> targets) const {
  DTRAIN_CHECK(slot >= 0 && slot < slots_, "slot {} of {}", slot, slots_);
  DTRAIN_CHECK(static_cast<int64_t>(inputs.size()) == slot_tokens_ && static_cast<int64_t>(targets.size()) == slot_tokens_,
               "inputs of {} and targets of {} tokens for slots of {}", inputs.size(), targets.size(), slot_tokens_);
  stream.copy(slot * slot_tokens_, inputs);
  stream.copy(slot * slot_tokens_ + 1, targets);
}

}  // namespace dtrain
