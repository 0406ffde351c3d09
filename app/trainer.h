// The training loop behind `dtrain train`: data (sharded by DistributedSampler) -> model ->
// cross-entropy -> DDP backward -> optimizer, on the runtime's device and ranks; rank 0 reports
// (app/reporter.h); test loss and accuracy on a sharded test set after every epoch.
#pragma once

#include "app/train_config.h"
#include "comm/runtime.h"
#include "data/npy_dataset.h"

namespace dtrain {

// Note [Reaching training]: once the data is loaded, the model built and broadcast and a checkpoint
// restored, the run tells dtrain-launch (comm/launch_channel.h) that this rank reached training:
// its --start-timeout bounds start-up only, never a run that outlasts it.
TrainResult train(Runtime& runtime, const TrainConfig& config);

// The training and test data of an image model (the data-parallel and the pipeline trainer's):
// NumPy arrays when --data-format says so (or found them), else IDX files (whose loader names
// what a folder of neither format lacks).
DatasetSplits load_image_data(const DataSettings& data);

}  // namespace dtrain
