// Test loss and accuracy of a model on a dataset sharded across ranks: rank r takes samples
// r, r + N, ... (no padding, so every sample counts once), and the sums are all-reduced.
#pragma once

#include "comm/communicator.h"
#include "data/dataset.h"
#include "model/module.h"

namespace dtrain {

struct Evaluation {
  double loss = 0;      // mean cross-entropy over the whole set
  double accuracy = 0;  // fraction of samples whose argmax is the label
  int64_t samples = 0;
};

// Collective over `control` (host memory). The model runs on `device` in evaluation mode and is
// back in training mode on return.
Evaluation evaluate(Module& model, const Dataset& data, Communicator& control, Device device);

}  // namespace dtrain
