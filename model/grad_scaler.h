// GradScaler: dynamic loss scaling for fp16 training, the algorithm of PyTorch's
// torch.cuda.amp.GradScaler. No MPI here: the ranks' agreement is ddp/loss_scaling.h.
//
// Note [Loss scaling]
//   fp16 keeps 10 mantissa bits over exponents 2^-14 .. 2^15 (subnormals to 2^-24, 65504 the
//   largest): small gradients of the fp16 GEMMs underflow to zero. So the loss gradient is
//   multiplied by a scale S (2^16 at first) before backward, and every parameter gradient,
//   after the all-reduce, by 1/S (unscale, before clipping: clip_grad_norm_ sees true
//   gradients), checking on the device whether any was an infinity or a NaN (an fp16 overflow
//   somewhere in backward). The ranks add their findings (each may check only its own slice of
//   the gradients, as under ZeRO): when any rank found one, every rank skips the step (no
//   clipping, no optimizer update) and S halves; else the step is taken, and after
//   growth_interval (2000) steps in a row without one S doubles (unless that overflows float).
//   S, the steps since the last change and the skipped steps are saved in checkpoints; the
//   decision costs one device-to-host read of the flag and one small collective per step.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "model/flat_store.h"
#include "model/module.h"

namespace dtrain {

struct GradScalerSettings {
  float init_scale = 65536.f;  // 2^16
  float growth_factor = 2.f;
  float backoff_factor = 0.5f;
  int64_t growth_interval = 2000;  // steps without inf/NaN before the scale grows
  bool dynamic = true;  // false: the scale stays init_scale (a step with an inf or a NaN is still skipped)
};

// What a checkpoint keeps of a GradScaler.
struct GradScalerState {
  float scale = 65536.f;
  int64_t growth_tracker = 0;  // steps without inf/NaN since the scale last changed
  int64_t skipped_steps = 0;   // steps skipped over the run
  bool operator==(const GradScalerState&) const = default;
};

// The state after a step that found (or not) an infinity or a NaN: PyTorch's _amp_update_scale_
// (found: scale * backoff, tracker 0; else tracker + 1, and at growth_interval scale * growth if
// that is finite, tracker 0), and the skipped-step count. Pure.
GradScalerState next_scaler_state(const GradScalerState& s, bool found_inf, const GradScalerSettings& settings);

// The gradients written since zero_grad() (an absent one, grad_is_zero, is skipped as PyTorch
// skips a None gradient); under ZeRO-2 the owned ones (FlatStore::grads_sharded), the only
// reduced ones. A GradSpan (model/flat_store.h) is n floats on the scaler's device.
std::vector<GradSpan> written_grads(const std::vector<Parameter*>& params);

class GradScaler {
 public:
  GradScaler(const GradScalerSettings& settings, Device device);

  // What the loss (its gradient) is multiplied by.
  float scale() const { return state_.scale; }
  const GradScalerState& state() const { return state_; }
  void set_state(const GradScalerState& state) { state_ = state; }
  const GradScalerSettings& settings() const { return settings_; }

  // Every gradient times float(1 / double(scale)) (PyTorch's inv_scale), and on the device the
  // number of chunks that held an infinity or a NaN before the multiply. Enqueued; no wait.
  void unscale(std::span<const GradSpan> grads);
  // That number (a device-to-host copy: waits for unscale()).
  float read_found_inf() const;
  // After the ranks have combined their findings (`any_found`: some rank found one): the next
  // state; true when the step is to be taken.
  bool update(bool any_found);

 private:
  GradScalerSettings settings_;
  GradScalerState state_;
  Device device_;
  Tensor flags_;       // [chunks]: 1 where a chunk held an inf/NaN; grown, never shrunk
  Tensor group_sums_;  // [ceil(chunks / kernels::kNormGroup)]
  Tensor found_;       // [1]
};

}  // namespace dtrain
