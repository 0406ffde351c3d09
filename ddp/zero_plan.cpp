#include "ddp/zero_plan.h"

#include <algorithm>

#include "core/error.h"

namespace dtrain {

namespace {
constexpr int64_t kBucketAlignFloats = 16;  // 64 bytes: a cache line, and what vector loads like
}  // namespace

FlatLayout lay_out_buckets(const std::vector<std::vector<size_t>>& buckets, const std::vector<int64_t>& param_numel,
                           int world) {
  DTRAIN_CHECK(world >= 1, "ZeRO over {} ranks", world);
  FlatLayout layout;
  layout.param_offset.assign(param_numel.size(), -1);
  int64_t offset = 0;
  for (const std::vector<size_t>& members : buckets) {
    int64_t at = offset;
    for (size_t p : members) {
      DTRAIN_CHECK(p < param_numel.size() && layout.param_offset[p] < 0, "bucket plan names parameter {} wrongly", p);
      layout.param_offset[p] = at;
      at += param_numel[p];
    }
    const int64_t size = (at - offset + world - 1) / world * world;
    layout.bucket_begin.push_back(offset);
    layout.bucket_size.push_back(size);
    offset += (size + kBucketAlignFloats - 1) / kBucketAlignFloats * kBucketAlignFloats;
  }
  layout.total = offset;
  return layout;
}

std::vector<ZeroChunk> zero_chunks(const FlatLayout& layout, const std::vector<std::vector<size_t>>& buckets,
                                   const std::vector<int64_t>& param_numel, int world, int rank) {
  DTRAIN_CHECK(rank >= 0 && rank < world, "rank {} of {}", rank, world);
  std::vector<ZeroChunk> chunks;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const int64_t per_rank = layout.bucket_size[b] / world;
    ZeroChunk chunk{b, {layout.bucket_begin[b] + rank * per_rank, layout.bucket_begin[b] + (rank + 1) * per_rank}, {}};
    for (size_t p : buckets[b]) {
      const int64_t off = layout.param_offset[p];
      const int64_t begin = std::max(off, chunk.range.begin), end = std::min(off + param_numel[p], chunk.range.end);
      if (begin < end) chunk.pieces.push_back({p, begin - off, end - begin, begin});
    }
    chunks.push_back(std::move(chunk));
  }
  return chunks;
}

}  // namespace dtrain
