// Note [ZeRO shards]: the padded bucket layout and each rank's chunks.
#include <gtest/gtest.h>

#include "ddp/zero_plan.h"

namespace dtrain {
namespace {

const std::vector<int64_t> kNumel = {35, 5, 15, 3, 1};
const std::vector<std::vector<size_t>> kBuckets = {{4, 3}, {2, 1}, {0}};

TEST(ZeroPlan, OneRankIsThePlainBucketLayout) {
  const FlatLayout l = lay_out_buckets(kBuckets, kNumel, 1);
  EXPECT_EQ(l.param_offset, (std::vector<int64_t>{48, 31, 16, 1, 0}));
  EXPECT_EQ(l.bucket_begin, (std::vector<int64_t>{0, 16, 48}));
  EXPECT_EQ(l.bucket_size, (std::vector<int64_t>{4, 20, 35}));
  EXPECT_EQ(l.total, 96);
  const std::vector<ZeroChunk> c = zero_chunks(l, kBuckets, kNumel, 1, 0);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[1].range, (FlatRange{16, 36}));
  EXPECT_EQ(c[1].pieces, (std::vector<ZeroPiece>{{2, 0, 15, 16}, {1, 0, 5, 31}}));
}

TEST(ZeroPlan, BucketsArePaddedToTheWorldAndChunksCoverEveryElementOnce) {
  for (int world : {2, 3, 4, 7}) {
    const FlatLayout l = lay_out_buckets(kBuckets, kNumel, world);
    for (size_t b = 0; b < kBuckets.size(); ++b) {
      EXPECT_EQ(l.bucket_size[b] % world, 0);
      EXPECT_EQ(l.bucket_begin[b] % 16, 0);
      if (b > 0) {
        EXPECT_GE(l.bucket_begin[b], l.bucket_begin[b - 1] + l.bucket_size[b - 1]);
      }
    }
    // Every element of every parameter is in exactly one rank's piece, at its flat place.
    std::vector<std::vector<int>> seen(kNumel.size());
    for (size_t p = 0; p < kNumel.size(); ++p) seen[p].assign(kNumel[p], 0);
    for (int r = 0; r < world; ++r) {
      const std::vector<ZeroChunk> chunks = zero_chunks(l, kBuckets, kNumel, world, r);
      ASSERT_EQ(chunks.size(), kBuckets.size());
      for (const ZeroChunk& c : chunks) {
        EXPECT_EQ(c.range.size(), l.bucket_size[c.bucket] / world);
        EXPECT_EQ(c.range.begin, l.bucket_begin[c.bucket] + r * c.range.size());
        for (const ZeroPiece& piece : c.pieces) {
          EXPECT_EQ(piece.flat_offset, l.param_offset[piece.param] + piece.param_offset);
          EXPECT_GE(piece.flat_offset, c.range.begin);
          EXPECT_LE(piece.flat_offset + piece.count, c.range.end);
          for (int64_t e = 0; e < piece.count; ++e) ++seen[piece.param][piece.param_offset + e];
        }
      }
    }
    for (size_t p = 0; p < kNumel.size(); ++p)
      for (int64_t e = 0; e < kNumel[p]; ++e) ASSERT_EQ(seen[p][e], 1) << "world " << world << " parameter " << p << " element " << e;
  }
}

TEST(ZeroPlan, ThreeRanksCutAParameterWhereTheChunksSay) {
  const FlatLayout l = lay_out_buckets(kBuckets, kNumel, 3);
  EXPECT_EQ(l.bucket_size[2], 36);  // 35 padded to 3 x 12
  EXPECT_EQ(zero_chunks(l, kBuckets, kNumel, 3, 1)[2].pieces, (std::vector<ZeroPiece>{{0, 12, 12, l.bucket_begin[2] + 12}}));
  EXPECT_EQ(zero_chunks(l, kBuckets, kNumel, 3, 2)[2].pieces, (std::vector<ZeroPiece>{{0, 24, 11, l.bucket_begin[2] + 24}}));
}

}  // namespace
}  // namespace dtrain
