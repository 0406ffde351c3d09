// LossScaling: the fp16 step's gate between the gradient all-reduce and the optimizer step
// (Note [Loss scaling] in model/grad_scaler.h). Each rank unscales and checks the gradients it
// was given (the trainers give every written gradient, under ZeRO too: an inf anywhere in a
// rank's local gradient reaches the reduced one, so the union of the ranks' checks is the
// check of the reduced gradient; passing only the owned chunks would save a pass under ZeRO-2,
// not done yet); the ranks add their findings in one
// all-reduce of one float, so every rank takes or skips the same steps and keeps the same scale
// (pytorch#136009, fairscale#179: ranks that disagree diverge, or hang in the next collective).
#pragma once

#include <span>

#include "comm/communicator.h"
#include "model/grad_scaler.h"

namespace dtrain {

class LossScaling {
 public:
  // `comm`: the ranks that share the step (the control communicator); the flag travels on the host.
  LossScaling(Communicator& comm, const GradScalerSettings& settings, Device device);

  float scale() const { return scaler_.scale(); }
  GradScaler& scaler() { return scaler_; }
  const GradScaler& scaler() const { return scaler_; }

  // Unscales and checks `grads`, waits for the result (the step's one device-to-host read), adds
  // every rank's finding, updates the scale. True: every rank takes the step; false: every rank
  // skips it. Collective.
  bool unscale_and_agree(std::span<const GradSpan> grads);

 private:
  Communicator& comm_;
  GradScaler scaler_;
};

}  // namespace dtrain
