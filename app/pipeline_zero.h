// StageZero: --zero 1 for a pipeline stage (app/pipeline_trainer.cpp), over the stage's
// data-parallel group.
//
// Note [Pipeline ZeRO-1]: DeepSpeed's ZeRO stage 1 with pipelining shards each stage's optimizer
// state over that stage's D replicas. A stage sums its gradients itself (PipelineStage: whole
// gradients, every replica the same bits), so this is ZeRO-1 after the sum: the stage's
// parameters are laid out as one bucket of the flat store (Note [ZeRO shards] in
// ddp/zero_plan.h, N = D), replica d owns chunk d of it, its optimizer keeps state for that chunk
// only and updates only it, and the optimizer's after-step hook all-gathers the updated chunks in
// place over the stage's group. Each element's update reads the same gradient and state as
// without ZeRO, so the weights are bitwise the unsharded pipeline's. Not yet: ZeRO-2 (the
// gradients reduce-scattered during backward) and the sharded state in checkpoints.
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "model/flat_store.h"
#include "pipeline/pipeline_stage.h"

namespace dtrain {

class StageZero {
 public:
  // Collective over the stage's replicas only in the all-gathers it later starts; here it moves
  // the stage's values and gradients (an optimizer over them moves its state). Build it before
  // the first step.
  explicit StageZero(PipelineStage& stage);
  ~StageZero();
  StageZero(const StageZero&) = delete;
  StageZero& operator=(const StageZero&) = delete;

 private:
  void gather_updated_values();

  Communicator& comm_;
  std::shared_ptr<FlatStore> store_;
  int64_t begin_ = 0, per_rank_ = 0;  // the one bucket's start and chunk size
};

}  // namespace dtrain
