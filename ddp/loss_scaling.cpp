#include "ddp/loss_scaling.h"

namespace dtrain {

LossScaling::LossScaling(Communicator& comm, const GradScalerSettings& settings, Device device)
    : comm_(comm), scaler_(settings, device) {}

bool LossScaling::unscale_and_agree(std::span<const GradSpan> grads) {
  scaler_.unscale(grads);
  float found = scaler_.read_found_inf();
  // Every rank must see every rank's finding: a rank that skipped alone would leave its
  // parameters behind the others' for good.
  if (comm_.size() > 1) comm_.allreduce(&found, 1, DType::kF32, ReduceOp::kSum);
  return scaler_.update(found > 0.f);
}

}  // namespace dtrain
