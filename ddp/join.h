// Join: training with uneven inputs, where ranks run different numbers of steps (PyTorch's
// torch.distributed.algorithms.Join with DDP). Each step starts with one small all-reduce of
// "I have a batch": while any rank has one, the ranks without data shadow the step with
// DistributedDataParallel::join_backward() (zero gradients through every bucket) and take the
// same optimizer step, so no rank waits for a collective that never comes and every replica
// stays bitwise equal; when no rank has data, every rank leaves the loop at the same step.
//
//   Join join(runtime.control());
//   while (join.any_rank_has_data(have_batch)) {
//     if (have_batch) { ...forward, loss...; ddp.backward(grad); } else { ddp.join_backward(); }
//     optimizer.step();
//     have_batch = next batch exists;
//   }
#pragma once

#include "comm/communicator.h"

namespace dtrain {

class Join {
 public:
  explicit Join(Communicator& control) : control_(control) {}

  // Collective (every rank, once per step): true while at least one rank has data.
  bool any_rank_has_data(bool mine);
  // How many ranks had data at the last call.
  int ranks_with_data() const { return ranks_with_data_; }
  // The highest rank that had data at the last call (-1: none): DDP's buffer source under Join
  // (DistributedDataParallel::set_buffer_source, Note [Buffer broadcast]).
  int highest_rank_with_data() const { return highest_rank_with_data_; }

 private:
  Communicator& control_;
  int ranks_with_data_ = 0;
  int highest_rank_with_data_ = -1;
};

}  // namespace dtrain
