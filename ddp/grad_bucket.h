// GradBucket: one flat gradient buffer shared by several parameters. Each parameter's .grad
// is a view into it, so backward writes straight into the buffer the all-reduce sends.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"

namespace dtrain {

struct GradBucket {
  size_t index = 0;
  Tensor buffer;                  // flat [numel] on the model's device (ZeRO: padded to a multiple of N)
  // ZeRO-2 (Note [ZeRO shards] in ddp/zero_plan.h): the bucket is reduce-scattered, this rank's
  // chunk of `shard_elements` elements at buffer + rank * shard_elements; 0: all-reduced.
  int64_t shard_elements = 0;
  // Where the reduced chunk goes when not in place (ZeRO-2's gradient ring: the rank's owned
  // gradients, Note [ZeRO-2 gradient ring] in ddp/reducer.h); null: in place.
  float* shard_out = nullptr;
  std::vector<size_t> params;     // parameter indices, in the order they become ready
  size_t pending = 0;             // gradients not yet ready in this backward
  WorkHandle work;                // the all-reduce in flight, if launched
  int64_t launched_ns = 0;        // host time the all-reduce was launched (for traces)
};

}  // namespace dtrain
