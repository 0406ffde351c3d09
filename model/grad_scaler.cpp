#include "model/grad_scaler.h"

#include <cmath>

#include "core/ops.h"
#include "model/flat_store.h"
#include "model/grad_clip.h"
#include "model/grad_clip_kernels.h"
#include "model/grad_scaler_kernels.h"

namespace dtrain {

GradScalerState next_scaler_state(const GradScalerState& s, bool found_inf, const GradScalerSettings& settings) {
  GradScalerState next = s;
  if (found_inf) ++next.skipped_steps;
  if (!settings.dynamic) return next;
  if (found_inf) {
    next.scale = s.scale * settings.backoff_factor;
    next.growth_tracker = 0;
    return next;
  }
  const int64_t successful = s.growth_tracker + 1;
  if (successful == settings.growth_interval) {
    const float grown = s.scale * settings.growth_factor;
    if (std::isfinite(grown)) next.scale = grown;
    next.growth_tracker = 0;
  } else {
    next.growth_tracker = successful;
  }
  return next;
}

std::vector<GradSpan> written_grads(const std::vector<Parameter*>& params) {
  // ZeRO-2: the reduced gradients this rank steps with are its owned ones (under the ring,
  // Note [ZeRO-2 gradient ring] in ddp/reducer.h, the parameters' views point at lent buffers).
  if (!params.empty() && params.front()->store && params.front()->store->grads_sharded())
    return params.front()->store->owned_grad_spans();
  std::vector<GradSpan> spans;
  spans.reserve(params.size());
  for (Parameter* p : params)
    if (!p->grad_is_zero) spans.push_back({p->grad.data(), p->grad.numel()});
  return spans;
}

GradScaler::GradScaler(const GradScalerSettings& settings, Device device)
    : settings_(settings), device_(device), found_(Tensor::zeros({1}, device)) {
  DTRAIN_CHECK(settings.init_scale > 0.f && std::isfinite(settings.init_scale), "loss scale {} must be positive",
               settings.init_scale);
  DTRAIN_CHECK(settings.growth_interval > 0, "growth interval {} must be positive", settings.growth_interval);
  state_.scale = settings.init_scale;
}

void GradScaler::unscale(std::span<const GradSpan> grads) {
  int64_t chunks = 0;
  for (const GradSpan& g : grads) chunks += grad_norm_chunks(g.n);
  if (chunks == 0) {
    fill(found_, 0.f);
    return;
  }
  if (!flags_.defined() || flags_.numel() < chunks) {  // the first step's size: no allocation after it
    flags_ = Tensor::zeros({chunks}, device_);
    group_sums_ = Tensor::zeros({(chunks + kernels::kNormGroup - 1) / kernels::kNormGroup}, device_);
  }
  const float inv_scale = static_cast<float>(1.0 / static_cast<double>(state_.scale));
  int64_t first = 0;
  for (const GradSpan& g : grads) {
    const int64_t c = grad_norm_chunks(g.n);
    launch(device_, c, kernels::UnscaleCheckStrided{flags_.data() + first, g.data, g.n, c, inv_scale});
    first += c;
  }
  // The flags summed as the clipper sums its partials: groups in parallel, then the groups.
  const int64_t groups = (chunks + kernels::kNormGroup - 1) / kernels::kNormGroup;
  launch(device_, groups, kernels::SumGroups{group_sums_.data(), flags_.data(), chunks});
  launch(device_, 1, kernels::SumToOne{found_.data(), group_sums_.data(), groups});
}

float GradScaler::read_found_inf() const { return found_.to_vector()[0]; }

bool GradScaler::update(bool any_found) {
  state_ = next_scaler_state(state_, any_found, settings_);
  return !any_found;
}

}  // namespace dtrain
