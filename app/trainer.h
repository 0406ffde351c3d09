// The training loop behind `dtrain train`: data (sharded by DistributedSampler) -> model ->
// cross-entropy -> DDP backward -> optimizer, on the runtime's device and ranks; rank 0 reports
// (app/reporter.h); test loss and accuracy on a sharded test set after every epoch.
#pragma once

#include "app/train_config.h"
#include "comm/runtime.h"

namespace dtrain {

TrainResult train(Runtime& runtime, const TrainConfig& config);

}  // namespace dtrain
