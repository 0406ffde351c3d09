// `dtrain train --pipeline-stages P`: the MLP or CNN cut into P stages over a P x D grid
// (Note [Pipeline grid], [Pipeline partition], [Pipeline schedules] in pipeline/). The log lines
// are today's, printed by the last stage of replica 0 (world rank P - 1), which holds the loss.
#pragma once

#include "app/train_config.h"
#include "comm/runtime.h"

namespace dtrain {

TrainResult train_pipeline(Runtime& runtime, const TrainConfig& config);

}  // namespace dtrain
