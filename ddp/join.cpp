// Join (see join.h): the per-step vote.
#include "ddp/join.h"

#include <cstdint>

namespace dtrain {

bool Join::any_rank_has_data(bool mine) {
  int32_t count = mine ? 1 : 0;
  control_.allreduce(&count, 1, DType::kI32, ReduceOp::kSum);
  ranks_with_data_ = count;
  return count > 0;
}

}  // namespace dtrain
