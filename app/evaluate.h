// Test loss and accuracy of a model on a dataset sharded across ranks: rank r takes samples
// r, r + N, ... (no padding, so every sample counts once), and the sums are all-reduced.
#pragma once

#include <string>

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

class LmBatches;

// A language model's validation loss: the mean cross-entropy of validation slots 0..batches-1
// (batches at most data.val_slots()), rank r taking slots r, r + N, ...; each rank's sum is
// all-reduced once. Collective over `control` (host memory); what `dtrain train --model gpt`
// logs as "val loss" and `dtrain eval` prints for GPT weights. The model runs in evaluation mode
// and is back in training mode on return.
double lm_validation_loss(Module& model, LmBatches& data, int64_t batches, Communicator& control);

// The seeds' line: "Test set: Average loss: 0.4700, Accuracy: 8333/10000 (83.33%)".
std::string test_set_line(const Evaluation& eval, int64_t test_size);

}  // namespace dtrain
