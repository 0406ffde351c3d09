// The flat layout of the gradient buckets and ZeRO's shards of it: pure functions, no state.
//
// Note [ZeRO shards]: bucket b of the flat layout starts on a 16-float boundary and holds its
// parameters back to back in bucket order; its size is padded to a multiple of N (the world
// size) with zeros that no update changes. Rank r owns the r-th of the N equal chunks of every
// bucket: it keeps optimizer state only for its chunks (compactly, K*Psi/N elements for K state
// arrays), updates only them, and gets the others' updated chunks by one in-place all-gather per
// bucket (ZeRO-1). Under ZeRO-2 each bucket is reduce-scattered into its chunks instead of
// all-reduced, while backward runs. Chunks follow the buckets, as llm.c's -z 1 slices each
// layer, so a chunk is reduced, updated and gathered with the bucket it belongs to. A parameter
// lies in one bucket, so a rank owns at most one contiguous piece of it: the slice its
// checkpoint entries describe (OptimizerState::Entry offset and full_shape). With N = 1 the
// layout is the plain DDP one (no padding) and the one chunk is the whole bucket.
#pragma once

#include <cstdint>
#include <vector>

#include "model/flat_store.h"

namespace dtrain {

struct FlatLayout {
  std::vector<int64_t> param_offset;  // per parameter: where it starts in the flat space
  std::vector<int64_t> bucket_begin;  // per bucket, a multiple of 16
  std::vector<int64_t> bucket_size;   // per bucket: its parameters' elements, padded to a multiple of N
  int64_t total = 0;                  // elements of the flat space
};

// `buckets` holds parameter indices (ddp/bucket_plan.h's plan), `param_numel` each parameter's
// elements, `world` the N the buckets are padded for (1: no padding).
FlatLayout lay_out_buckets(const std::vector<std::vector<size_t>>& buckets, const std::vector<int64_t>& param_numel,
                           int world);

// Elements [param_offset, param_offset + count) of the flattened parameter `param`, at
// `flat_offset` of the flat space.
struct ZeroPiece {
  size_t param = 0;
  int64_t param_offset = 0, count = 0, flat_offset = 0;
  bool operator==(const ZeroPiece&) const = default;
};
// Rank r's chunk of one bucket: a flat range of bucket_size / N elements and the parameter
// pieces in it, in flat order (none in a chunk of padding only).
struct ZeroChunk {
  size_t bucket = 0;
  FlatRange range;
  std::vector<ZeroPiece> pieces;
};

// Rank `rank`'s chunk of every bucket of `layout` (made by lay_out_buckets with the same
// buckets and N = world), in bucket order.
std::vector<ZeroChunk> zero_chunks(const FlatLayout& layout, const std::vector<std::vector<size_t>>& buckets,
                                   const std::vector<int64_t>& param_numel, int world, int rank);

}  // namespace dtrain
