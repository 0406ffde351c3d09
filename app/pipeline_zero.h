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
// without ZeRO, so the weights are bitwise the unsharded pipeline's. In checkpoints (Note [Pipeline
// checkpoints] in train/checkpointer.h) every replica saves its chunk's state as its shard, and a
// resume asks for the chunk of the new layout: any P x D, with or without --zero, re-cut by the
// data-parallel ZeRO's transfer (train/optimizer_transfer.h). The GPT's tied wte (Note [Tied
// stages]) is in the first and the last stage's stores, each sharded over its own replicas: both
// copies take the same whole gradient, so their chunks' updates agree, and the state is saved by
// the first stage's replicas alone.
//
// ZeRO-2 (--zero 2, the MLP and the CNN): the stage does not all-reduce its gradients; after the
// step's last backward one reduce-scatter of the bucket gives each replica the sum of its chunk
// (on one node the bits the all-reduce gives those elements), which is all its update reads: half
// the all-reduce's traffic. It keeps no memory back here: a stage accumulates its M micro-batches'
// gradients whole (as DDP's ZeRO-2 under no_sync), which is why DeepSpeed refuses ZeRO-2 with
// pipelining. The replica's gradients beyond its chunk are not sums, so the store's gradients
// are marked sharded: --clip-grad-norm adds each replica's chunk's squares over the stage's
// replicas, then over the stages (Note [Pipeline gradient norm]; within rounding of the unsharded
// norm), and the fp16 check reads the chunk. The GPT's tied wte: each replica's two ends add
// their local gradients before the reduce-scatter (Note [Tied stages]), and the norm leaves the
// last stage's chunk of its copy out.
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "model/flat_store.h"
#include "model/module.h"
#include "pipeline/grid.h"

namespace dtrain {

// Note [Pipeline on a GPU] (pipeline/grid.h): not built yet is ZeRO there (its store's
// collectives would go over the stage's device communicator); the refusal's text, after
// "--pipeline-stages P: not yet with ".
inline constexpr const char* kPipelineZeroOnGpu = "--zero on a GPU (only on --device cpu so far)";

class StageZero {
 public:
  // Collective over the stage's replicas only in the all-gathers it later starts; here it moves
  // the values and gradients of `stage` (this rank's layers of the pipeline `grid`; an optimizer
  // over them moves its state). Build it before the first step, and before a resume asks for
  // this replica's pieces of the optimizer state (wanted_pieces: its chunk's).
  // `reduce_scatter`: ZeRO-2, the gradients reduce-scattered (reduce_scatter_gradients), the
  // store's gradients marked sharded, so the fp16 check and the clipping norm read the replica's
  // own chunk of the sums only.
  StageZero(Module& stage, const PipelineGrid& grid, bool reduce_scatter = false);
  ~StageZero();
  // ZeRO-2, after the step's last backward (the stage built with sum_gradients false): the
  // replicas' local gradients reduce-scattered, each replica's chunk the sum the stage's
  // all-reduce would give it (the rest of its gradient stays its own, unread by the update).
  void reduce_scatter_gradients();
  StageZero(const StageZero&) = delete;
  StageZero& operator=(const StageZero&) = delete;

 private:
  void gather_updated_values();

  Communicator& comm_;
  std::shared_ptr<FlatStore> store_;
  int64_t begin_ = 0, per_rank_ = 0;  // the one bucket's start and chunk size
};

}  // namespace dtrain
