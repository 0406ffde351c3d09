// `dtrain train --pipeline-stages P`: the MLP or CNN cut into P stages over a P x D grid
// (Note [Pipeline grid], [Pipeline partition], [Pipeline schedules] in pipeline/). The log lines
// are today's, printed by the last stage of replica 0 (world rank P - 1), which holds the loss.
#pragma once

#include "app/train_config.h"
#include "comm/runtime.h"
#include "pipeline/grid.h"

namespace dtrain {

// Both pipeline trainers' grid over the runtime's world (one line unless the stages divide it),
// on a GPU with its NCCL communicators for device tensors (Note [Pipeline on a GPU] in
// pipeline/grid.h); what the GPU path does not do yet (kPipelineZeroOnGpu) is refused first.
PipelineGrid make_trainer_grid(Runtime& runtime, const TrainConfig& config);

TrainResult train_pipeline(Runtime& runtime, const TrainConfig& config);

}  // namespace dtrain
