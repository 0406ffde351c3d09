// One micro-batch's forward and backward, shared by the image loop (app/trainer.cpp) and the
// language-model loop (app/lm_trainer.cpp): model -> cross-entropy -> backward, through DDP when
// there is more than one rank (no_sync for every micro-batch but a step's last), the loss
// gradient divided by the step's micro-batch count so the step sees their mean.
#pragma once

#include <cstdint>

#include "app/trace.h"
#include "core/tensor.h"
#include "ddp/distributed_data_parallel.h"
#include "model/loss.h"
#include "model/module.h"

namespace dtrain {

struct MicroStep {
  int64_t step_size = 1;  // micro-batches in this optimizer step
  bool ends_step = true;  // the step's last: its backward all-reduces
};

// Returns the micro-batch's loss (a one-element device tensor). `ddp` is null on one rank.
Tensor forward_backward(Module& model, DistributedDataParallel* ddp, CrossEntropyLoss& loss_fn, Tracer& tracer,
                        const Tensor& input, const Tensor& targets, const MicroStep& micro);

}  // namespace dtrain
