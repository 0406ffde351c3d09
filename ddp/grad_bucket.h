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
  Tensor buffer;                  // flat [numel] on the model's device
  std::vector<size_t> params;     // parameter indices, in the order they become ready
  size_t pending = 0;             // gradients not yet ready in this backward
  WorkHandle work;                // the all-reduce in flight, if launched
  int64_t launched_ns = 0;        // host time the all-reduce was launched (for traces)
};

}  // namespace dtrain
