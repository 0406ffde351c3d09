// The start-up line that says what one rank holds: its parameters, gradients and optimizer
// state in bytes, under the run's --zero (Note [ZeRO shards] in ddp/zero_plan.h).
#pragma once

#include <string>

#include "model/optimizer.h"

namespace dtrain {

// "memory per rank: parameters 204.6 MiB, gradients 204.6 MiB, optimizer state 136.4 MiB
// (--zero 1 over 3 ranks: ...)". Gradients are the whole flat buffer, ZeRO-2 included: backward
// writes every parameter's gradient into it before its bucket is reduce-scattered.
std::string memory_line(Optimizer& optimizer, int zero_stage, int ranks);

}  // namespace dtrain
