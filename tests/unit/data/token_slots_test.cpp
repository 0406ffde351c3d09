// TokenSlotSampler (Note [Token slots]): the peer's order without shuffling, every slot once per
// shuffled epoch and disjoint ranks within a step, the same order on every rank, and resuming
// at another world size without skipping or repeating a slot.
#include "data/token_slots.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "data/distributed_sampler.h"
#include "data/token_shards.h"
#include "temp_dir.h"

namespace dtrain {
namespace {

using ::testing::ElementsAre;
using testing::TempDir;

// torch_gpt_peer.py's batch(): slots = (len - 1) // (B*T); p = ((step*world + rank) % slots) * B*T.
int64_t peer_start(int64_t len, int64_t step, int rank, int world, int64_t bt) {
  const int64_t slots = (len - 1) / bt;
  return ((step * world + rank) % slots) * bt;
}

TEST(TokenSlots, SlotCountIsTokensMinusOneOverBatchTokens) {
  EXPECT_EQ(TokenSlotSampler(49, 8, false).slots(), 6);  // 48 = 6 x 8: the last slot's target is token 48
  EXPECT_EQ(TokenSlotSampler(48, 8, false).slots(), 5);
  EXPECT_EQ(TokenSlotSampler(9, 8, false).slots(), 1);
  EXPECT_THROW(TokenSlotSampler(8, 8, false), Error);
  EXPECT_THROW(TokenSlotSampler(0, 8, false), Error);
}

TEST(TokenSlots, UnshuffledOrderIsThePeers) {
  for (int64_t len : {9, 48, 50, 64, 101, 257}) {  // 48, 64: a multiple of B*T leaves its last slot out
    for (int world : {1, 2, 3}) {
      TokenSlotSampler s(len, 8, false);
      for (int64_t step = 0; step < 40; ++step)
        for (int rank = 0; rank < world; ++rank)
          EXPECT_EQ(s.slot(slot_counter(0, step, world, rank)) * 8, peer_start(len, step, rank, world, 8))
              << "len " << len << " world " << world << " step " << step << " rank " << rank;
    }
  }
  // By hand, S = (50 - 1) div 8 = 6 slots, N = 2: step 0 reads slots 0 and 1, step 3 slots 0 and 1 again.
  TokenSlotSampler s(50, 8, false);
  std::vector<int64_t> steps;
  for (int64_t step = 0; step < 4; ++step)
    for (int rank = 0; rank < 2; ++rank) steps.push_back(s.slot(slot_counter(0, step, 2, rank)));
  EXPECT_THAT(steps, ElementsAre(0, 1, 2, 3, 4, 5, 0, 1));
}

TEST(TokenSlots, ReadsInputsAndTargetsShiftedByOne) {
  TempDir dir;
  std::vector<uint32_t> tokens(21);
  std::iota(tokens.begin(), tokens.end(), 100u);
  write_token_shard(dir.file("a.bin"), std::span(tokens).first(5));
  write_token_shard(dir.file("b.bin"), std::span(tokens).subspan(5));
  const TokenStream stream = TokenStream::open({dir.file("a.bin"), dir.file("b.bin")});
  TokenSlotSampler s(stream.size(), 4, false);  // B*T = 4 (say B 2, T 2): 5 slots
  ASSERT_EQ(s.slots(), 5);
  std::vector<int32_t> x(4), y(4);
  s.read(stream, 1, x, y);
  EXPECT_THAT(x, ElementsAre(104, 105, 106, 107));
  EXPECT_THAT(y, ElementsAre(105, 106, 107, 108));
  s.read(stream, 4, x, y);  // the last slot: its last target is the stream's last token
  EXPECT_THAT(x, ElementsAre(116, 117, 118, 119));
  EXPECT_THAT(y, ElementsAre(117, 118, 119, 120));
  EXPECT_THROW(s.read(stream, 5, x, y), Error);
}

TEST(TokenSlots, ShuffledEpochReadsEverySlotOnce) {
  for (int64_t slots : {1, 2, 7, 64}) {
    TokenSlotSampler s(slots * 8 + 1, 8, true, 42);
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      std::vector<int64_t> seen;
      for (int64_t i = 0; i < slots; ++i) seen.push_back(s.slot(epoch * slots + i));
      std::sort(seen.begin(), seen.end());
      std::vector<int64_t> all(static_cast<size_t>(slots));
      std::iota(all.begin(), all.end(), int64_t{0});
      EXPECT_EQ(seen, all) << slots << " slots, epoch " << epoch;
    }
  }
}

TEST(TokenSlots, ShuffledOrderDependsOnSeedAndEpochAndIsTheSameOnEveryRank) {
  const int64_t slots = 50;
  auto epoch_order = [&](uint64_t seed, int64_t epoch) {
    TokenSlotSampler s(slots * 4 + 1, 4, true, seed);
    std::vector<int64_t> out;
    for (int64_t i = 0; i < slots; ++i) out.push_back(s.slot(epoch * slots + i));
    return out;
  };
  std::vector<int64_t> identity(slots);
  std::iota(identity.begin(), identity.end(), int64_t{0});
  EXPECT_NE(epoch_order(0, 0), identity);
  EXPECT_NE(epoch_order(0, 0), epoch_order(0, 1));
  EXPECT_NE(epoch_order(0, 0), epoch_order(1, 0));
  EXPECT_EQ(epoch_order(7, 3), epoch_order(7, 3));  // a second sampler (another rank) agrees
  // The permutation of epoch e is seeded_permutation(S, seed + e), pinned here so that it never
  // changes under a checkpoint.
  EXPECT_EQ(epoch_order(5, 2), seeded_permutation(slots, 7));
  // Asked out of order (another rank's counters interleave epochs), the answers do not change.
  TokenSlotSampler s(slots * 4 + 1, 4, true, 5);
  const std::vector<int64_t> e2 = epoch_order(5, 2), e0 = epoch_order(5, 0);
  EXPECT_EQ(s.slot(2 * slots + 3), e2[3]);
  EXPECT_EQ(s.slot(0 * slots + 9), e0[9]);
  EXPECT_EQ(s.slot(2 * slots + 4), e2[4]);
}

TEST(TokenSlots, RanksOfAStepReadDifferentSlotsWithinAnEpoch) {
  const int64_t slots = 12;
  for (int world : {2, 3, 4}) {
    std::vector<TokenSlotSampler> ranks(static_cast<size_t>(world), TokenSlotSampler(slots * 8 + 1, 8, true, 3));
    for (int64_t step = 0; step < 3 * slots / world; ++step) {
      std::set<int64_t> read;
      for (int r = 0; r < world; ++r) read.insert(ranks[static_cast<size_t>(r)].slot(slot_counter(0, step, world, r)));
      EXPECT_EQ(static_cast<int>(read.size()), world) << "world " << world << " step " << step;
    }
  }
}

// A run at world size 2 stopped after `steps`, resumed at `world` from g0 = steps x 2: over the
// whole run the counters are 0, 1, 2, ... with none skipped or repeated, so each epoch reads each
// slot once, exactly as an uninterrupted run at world size 1 would.
TEST(TokenSlots, ResumingAtAnotherWorldSizeNeitherSkipsNorRepeats) {
  const int64_t slots = 10;
  for (int world : {1, 2, 3, 4}) {
    for (bool shuffle : {false, true}) {
      TokenSlotSampler reference(slots * 4 + 1, 4, shuffle, 9);
      std::vector<int64_t> expected, got;
      for (int64_t g = 0; g < 30; ++g) expected.push_back(reference.slot(g));
      TokenSlotSampler before(slots * 4 + 1, 4, shuffle, 9);
      const int64_t steps_before = 7;
      for (int64_t step = 0; step < steps_before; ++step)
        for (int r = 0; r < 2; ++r) got.push_back(before.slot(slot_counter(0, step, 2, r)));
      const int64_t g0 = steps_before * 2;
      std::vector<TokenSlotSampler> after(static_cast<size_t>(world), TokenSlotSampler(slots * 4 + 1, 4, shuffle, 9));
      for (int64_t step = 0; static_cast<int64_t>(got.size()) < 30; ++step)
        for (int r = 0; r < world && static_cast<int64_t>(got.size()) < 30; ++r)
          got.push_back(after[static_cast<size_t>(r)].slot(slot_counter(g0, step, world, r)));
      EXPECT_EQ(got, expected) << "world " << world << " shuffle " << shuffle;
    }
  }
}

}  // namespace
}  // namespace dtrain
