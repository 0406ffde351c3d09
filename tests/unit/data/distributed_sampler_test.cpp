// DistributedSampler: PyTorch's sharding (disjoint strided shards, padding, drop_last), the
// per-epoch reshuffle, and agreement across ranks from the seed alone.
#include "data/distributed_sampler.h"

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace dtrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::vector<int64_t>> shards(int64_t n, int replicas, bool shuffle, uint64_t seed, bool drop_last,
                                         int64_t epoch) {
  std::vector<std::vector<int64_t>> out;
  for (int r = 0; r < replicas; ++r) {
    DistributedSampler s(n, replicas, r, shuffle, seed, drop_last ? SamplerTail::kDropLast : SamplerTail::kPad);
    s.set_epoch(epoch);
    out.push_back(s.indices());
  }
  return out;
}

TEST(DistributedSampler, ShardsAreDisjointAndCoverEveryIndex) {
  for (int replicas : {1, 2, 3, 4, 7}) {
    const int64_t n = 1000;
    auto all = shards(n, replicas, true, 42, false, 3);
    std::map<int64_t, int> seen;
    for (const auto& shard : all) {
      EXPECT_EQ(static_cast<int64_t>(shard.size()), (n + replicas - 1) / replicas);
      for (int64_t i : shard) ++seen[i];
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), n) << replicas << " replicas";
    int64_t repeats = 0;
    for (auto [index, count] : seen) {
      EXPECT_TRUE(index >= 0 && index < n);
      repeats += count - 1;
    }
    // Only the padding repeats: total_size - n indices appear twice.
    EXPECT_EQ(repeats, (n + replicas - 1) / replicas * replicas - n) << replicas << " replicas";
  }
}

TEST(DistributedSampler, DivisibleSizeGivesExactPartition) {
  auto all = shards(12, 4, true, 7, false, 0);
  std::vector<int64_t> merged;
  for (const auto& s : all) merged.insert(merged.end(), s.begin(), s.end());
  std::sort(merged.begin(), merged.end());
  EXPECT_THAT(merged, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11));
}

TEST(DistributedSampler, PadsByRepeatingFromTheStart) {
  // N=10, R=3: the unshuffled list 0..9 is padded with 0, 1 to 12 and strided.
  DistributedSampler s0(10, 3, 0, false), s1(10, 3, 1, false), s2(10, 3, 2, false);
  EXPECT_EQ(s0.num_samples(), 4);
  EXPECT_EQ(s0.total_size(), 12);
  EXPECT_THAT(s0.indices(), ElementsAre(0, 3, 6, 9));
  EXPECT_THAT(s1.indices(), ElementsAre(1, 4, 7, 0));
  EXPECT_THAT(s2.indices(), ElementsAre(2, 5, 8, 1));
}

TEST(DistributedSampler, PaddingCyclesWhenFewerSamplesThanReplicas) {
  // N=2, R=5: PyTorch repeats the whole list as often as needed.
  auto all = shards(2, 5, false, 0, false, 0);
  std::vector<int64_t> firsts;
  for (const auto& s : all) {
    ASSERT_EQ(s.size(), 1u);
    firsts.push_back(s[0]);
  }
  EXPECT_THAT(firsts, ElementsAre(0, 1, 0, 1, 0));
}

TEST(DistributedSampler, DropLastTruncates) {
  DistributedSampler s0(10, 3, 0, false, 0, SamplerTail::kDropLast), s2(10, 3, 2, false, 0, SamplerTail::kDropLast);
  EXPECT_EQ(s0.num_samples(), 3);
  EXPECT_EQ(s0.total_size(), 9);
  EXPECT_THAT(s0.indices(), ElementsAre(0, 3, 6));
  EXPECT_THAT(s2.indices(), ElementsAre(2, 5, 8));
  auto all = shards(10, 3, true, 5, true, 2);
  std::set<int64_t> seen;
  for (const auto& s : all) {
    EXPECT_EQ(s.size(), 3u);
    seen.insert(s.begin(), s.end());
  }
  EXPECT_EQ(seen.size(), 9u) << "drop_last shards must not overlap";
  EXPECT_EQ(DistributedSampler(2, 3, 1, true, 0, SamplerTail::kDropLast).num_samples(), 0);
}

TEST(DistributedSampler, ReshufflesPerEpochAndRepeatsForSameSeedAndEpoch) {
  DistributedSampler a(500, 2, 1, true, 9), b(500, 2, 1, true, 9);
  a.set_epoch(0);
  std::vector<int64_t> e0 = a.indices();
  a.set_epoch(1);
  std::vector<int64_t> e1 = a.indices();
  EXPECT_NE(e0, e1) << "epoch 1 must reshuffle";
  std::vector<int64_t> s0 = e0, s1 = e1;
  std::sort(s0.begin(), s0.end());
  std::sort(s1.begin(), s1.end());
  EXPECT_NE(s0, s1) << "a rank must see different samples across epochs, not only a new order";

  b.set_epoch(1);
  EXPECT_EQ(b.indices(), e1);
  a.set_epoch(0);
  EXPECT_EQ(a.indices(), e0) << "going back to an epoch gives its permutation again";
  DistributedSampler other_seed(500, 2, 1, true, 10);
  EXPECT_NE(other_seed.indices(), e0);
}

TEST(DistributedSampler, ShuffleIsAPermutationAndNotIdentity) {
  std::vector<int64_t> p = seeded_permutation(1000, 123);
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[static_cast<size_t>(i)], i);
  int64_t fixed = 0;
  for (int64_t i = 0; i < 1000; ++i) fixed += p[static_cast<size_t>(i)] == i;
  EXPECT_LT(fixed, 20) << "a shuffle leaves about one element in place";
}

TEST(DistributedSampler, PermutationIsPinnedAcrossPlatforms) {
  // Fixed by std::mt19937_64 (fully specified) and our own draw: a change here would make
  // ranks built with different compilers disagree.
  // Values checked against an independent implementation of mt19937_64 and this shuffle.
  EXPECT_THAT(seeded_permutation(10, 0), ElementsAre(7, 2, 0, 8, 3, 9, 6, 1, 5, 4));
  DistributedSampler s(10, 3, 1, true, 5);
  s.set_epoch(2);  // permutation seeded by 5 + 2, padded with its first two entries
  EXPECT_THAT(s.indices(), ElementsAre(7, 3, 8, 0));
}

TEST(DistributedSampler, ValidatesArguments) {
  auto message = [](auto make) -> std::string {
    try {
      make();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_THAT(message([] { DistributedSampler(10, 0, 0); }), HasSubstr("num_replicas must be >= 1, got 0"));
  EXPECT_THAT(message([] { DistributedSampler(10, 2, 2); }), HasSubstr("rank 2 is out of range [0, 2)"));
  EXPECT_THAT(message([] { DistributedSampler(10, 2, -1); }), HasSubstr("rank -1 is out of range [0, 2)"));
  EXPECT_THAT(message([] { DistributedSampler(-1, 2, 0); }), HasSubstr("dataset size -1 is negative"));
  DistributedSampler empty(0, 2, 1);
  EXPECT_EQ(empty.num_samples(), 0);
  EXPECT_TRUE(empty.indices().empty());
}

// A run resumed mid-epoch at the world size that saved it continues exactly where it stopped:
// each rank's remaining indices are the tail of the uninterrupted epoch's.
TEST(DistributedSampler, ResumedAtTheSameWorldSizeContinuesTheEpochExactly) {
  for (bool drop_last : {false, true})
    for (int world : {1, 2, 3})
      for (int64_t batches_done : {0, 1, 4}) {
        const int64_t batch = 5, n = 67, position = batches_done * batch * world;
        for (int rank = 0; rank < world; ++rank) {
          DistributedSampler s(n, world, rank, true, 11, drop_last ? SamplerTail::kDropLast : SamplerTail::kPad);
          s.set_epoch(3);
          const std::vector<int64_t> all = s.indices();
          const std::vector<int64_t> tail(all.begin() + batches_done * batch, all.end());
          EXPECT_EQ(s.indices_from(position), tail) << "world " << world << " rank " << rank << " after "
                                                    << batches_done << " batches, drop_last " << drop_last;
        }
      }
}

// At another world size the rest of the epoch's order is split anew: with the positions already
// used, every sample of the epoch is used exactly once (the counts here need no padding), and
// with padding only the list's first entries are used a second time, as DistributedSampler pads.
TEST(DistributedSampler, ResumedAtAnotherWorldSizeUsesEverySampleOnce) {
  const int64_t n = 60, batch = 4;
  for (auto [before, after] : {std::pair{2, 3}, std::pair{3, 2}, std::pair{2, 4}, std::pair{4, 3}}) {
    for (int64_t batches_done : {0, 1, 3}) {
      const int64_t position = batches_done * batch * before;
      std::vector<int> uses(n, 0);
      for (int rank = 0; rank < before; ++rank) {
        DistributedSampler s(n, before, rank, true, 2);
        s.set_epoch(1);
        const std::vector<int64_t> all = s.indices();
        for (int64_t i = 0; i < batches_done * batch; ++i) ++uses[static_cast<size_t>(all[static_cast<size_t>(i)])];
      }
      int64_t taken = 0;
      for (int rank = 0; rank < after; ++rank) {
        DistributedSampler s(n, after, rank, true, 2);
        s.set_epoch(1);
        for (int64_t i : s.indices_from(position)) ++uses[static_cast<size_t>(i)], ++taken;
      }
      const int64_t padding = (after - (n - position) % after) % after;
      EXPECT_EQ(taken, n - position + padding);
      const std::vector<int64_t> order = seeded_permutation(n, 2 + 1);
      for (int64_t i = 0; i < n; ++i) {
        const bool padded = std::find(order.begin(), order.begin() + padding, i) != order.begin() + padding;
        EXPECT_EQ(uses[static_cast<size_t>(i)], padded ? 2 : 1)
            << "sample " << i << ", " << before << " -> " << after << " ranks after " << batches_done << " batches";
      }
    }
  }
}

TEST(DistributedSampler, WithoutShuffleRankRTakesRPlusMultiplesOfN) {
  DistributedSampler s(10, 3, 1, false);
  EXPECT_THAT(s.indices(), ElementsAre(1, 4, 7, 0));  // padded from the start, as PyTorch's
  EXPECT_THAT(s.indices_from(6), ElementsAre(7, 0));
}

TEST(DistributedSampler, RejectsAPositionOutsideTheEpoch) {
  DistributedSampler s(10, 2, 0);
  EXPECT_THROW(s.indices_from(11), Error);
  EXPECT_THROW(s.indices_from(-1), Error);
  EXPECT_TRUE(s.indices_from(10).empty());
}

// uneven: every sample of the epoch exactly once over all ranks, no padding, no dropping; the
// shares differ by at most one sample; the same shuffled order as pad.
TEST(DistributedSampler, UnevenUsesEverySampleOnceWithoutPadding) {
  for (int64_t n : {0, 1, 5, 10, 11, 100}) {
    for (int replicas : {1, 2, 3, 7}) {
      std::vector<int64_t> all;
      int64_t smallest = n, largest = 0;
      for (int r = 0; r < replicas; ++r) {
        DistributedSampler s(n, replicas, r, true, 3, SamplerTail::kUneven);
        s.set_epoch(2);
        const std::vector<int64_t> mine = s.indices();
        EXPECT_EQ(static_cast<int64_t>(mine.size()), s.num_samples());
        DistributedSampler padded(n, replicas, r, true, 3);
        padded.set_epoch(2);
        const std::vector<int64_t> p = padded.indices();
        EXPECT_TRUE(std::equal(mine.begin(), mine.end(), p.begin())) << "the same order as pad, without its tail";
        smallest = std::min<int64_t>(smallest, static_cast<int64_t>(mine.size()));
        largest = std::max<int64_t>(largest, static_cast<int64_t>(mine.size()));
        all.insert(all.end(), mine.begin(), mine.end());
      }
      std::sort(all.begin(), all.end());
      std::vector<int64_t> expect(static_cast<size_t>(n));
      std::iota(expect.begin(), expect.end(), int64_t{0});
      EXPECT_EQ(all, expect) << n << " samples, " << replicas << " ranks";
      EXPECT_LE(largest - smallest, 1);
    }
  }
  DistributedSampler s(11, 3, 2, false, 0, SamplerTail::kUneven);
  EXPECT_THAT(s.indices_from(4), ElementsAre(6, 9));  // positions 6, 9 of the rest [4, 11)
  EXPECT_EQ(s.total_size(), 11);
}

}  // namespace
}  // namespace dtrain
