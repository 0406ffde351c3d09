// Join (see join.h): the per-step vote.
#include "ddp/join.h"

#include <cstdint>
#include <vector>

namespace dtrain {

bool Join::any_rank_has_data(bool mine) {
  // Every rank's vote, not only their sum: the highest rank with data is DDP's buffer source.
  const int32_t vote = mine ? 1 : 0;
  std::vector<int32_t> votes(static_cast<size_t>(control_.size()));
  control_.allgather(&vote, votes.data(), 1, DType::kI32);
  ranks_with_data_ = 0;
  highest_rank_with_data_ = -1;
  for (size_t r = 0; r < votes.size(); ++r)
    if (votes[r]) {
      ++ranks_with_data_;
      highest_rank_with_data_ = static_cast<int>(r);
    }
  return ranks_with_data_ > 0;
}

}  // namespace dtrain
