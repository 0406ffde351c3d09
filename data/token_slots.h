// TokenSlotSampler: which B*T tokens of a token stream each rank reads at each step of a language
// model run (issue 21's shared contract).
//
// Note [Token slots]
//   A stream of L tokens holds S = (L - 1) div (B*T) slots; slot k is inputs = tokens
//   [k*B*T, k*B*T + B*T) and targets = the same shifted by one (so the last slot's targets need
//   the token after it: hence L - 1). The run counts slots globally: at step s of a run that
//   began with g0 slots already consumed, rank r of N reads g = g0 + s*N + r. Without shuffling
//   g reads slot g mod S: with g0 = 0 that is torch_gpt_peer.py's order, so a run can be
//   replayed in PyTorch. Shuffled, epoch e = g div S reads its slots in the order of a
//   permutation seeded by seed + e (data/distributed_sampler.h's seeded_permutation: the same
//   on every platform), so every slot is read once per epoch and the ranks of a step read
//   different slots. The one exception: a step that straddles two epochs (when N does not
//   divide S) may read one slot twice, at the end of one epoch's order and the start of the
//   next's; keeping every epoch whole and every epoch's order independent of N matters more.
//   The state to resume is g0 alone: a run resumed at another world size reads g0, g0 + 1, ...
//   on, so no slot is skipped or repeated.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "data/token_shards.h"

namespace dtrain {

class TokenSlotSampler {
 public:
  // Slots of `slot_tokens` (B*T) tokens over a stream of `stream_tokens`. Throws Error (kData)
  // when the stream holds no slot (fewer than slot_tokens + 1 tokens); slot_tokens must be >= 1.
  TokenSlotSampler(int64_t stream_tokens, int64_t slot_tokens, bool shuffle, uint64_t seed = 0);

  int64_t slots() const { return slots_; }
  int64_t slot_tokens() const { return slot_tokens_; }

  // The slot that global slot counter g (>= 0) reads (Note [Token slots]). Not const: the
  // shuffled order of the latest epoch asked for is kept (one vector of S entries).
  int64_t slot(int64_t g);

  // Copies slot `slot` of `stream` into inputs and targets (slot_tokens() each; [B, T] row-major).
  void read(const TokenStream& stream, int64_t slot, std::span<int32_t> inputs, std::span<int32_t> targets) const;

 private:
  int64_t slots_;
  int64_t slot_tokens_;
  bool shuffle_;
  uint64_t seed_;
  int64_t epoch_ = -1;  // the epoch order_ belongs to
  std::vector<int64_t> order_;
};

// The global slot counter of rank `rank` of `world` at step `step` of a run that began with
// `start` slots consumed: start + step * world + rank.
constexpr int64_t slot_counter(int64_t start, int64_t step, int world, int rank) {
  return start + step * world + rank;
}

}  // namespace dtrain
