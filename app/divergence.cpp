#include "app/divergence.h"

#include <chrono>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "core/ops.h"
#include "model/loss.h"

namespace dtrain {

LossWatch::LossWatch(Device device, bool read_every_step, double read_period_ms)
    : read_every_step_(read_every_step), read_period_ms_(read_period_ms), last_read_(std::chrono::steady_clock::now()) {
  if (read_every_step_) return;
  sum_ = Tensor::empty({1}, device);
  fill(sum_, 0.f);
}

void LossWatch::record(const Tensor& loss, const StepPlace& at) {
  if (found_.found) return;
  if (read_every_step_) {
    const float v = loss_value(loss);  // a host float: no copy worth the name
    if (!std::isfinite(v)) found_ = {true, true, v, at, at};
    return;
  }
  if (!unchecked_) first_unchecked_ = at;
  axpy(sum_, loss, 1.f);  // queued on the device: no synchronisation
  last_recorded_ = at;
  unchecked_ = true;
}

LossFinding LossWatch::check(bool must) {
  if (found_.found || read_every_step_ || !unchecked_) return found_;
  const auto now = std::chrono::steady_clock::now();
  if (!must && std::chrono::duration<double, std::milli>(now - last_read_).count() < read_period_ms_) return found_;
  last_read_ = now;
  const float sum = loss_value(sum_);
  if (!std::isfinite(sum)) {
    found_ = {true, first_unchecked_.step == last_recorded_.step, sum, first_unchecked_, last_recorded_};
  } else {
    fill(sum_, 0.f);
    unchecked_ = false;
  }
  return found_;
}

namespace {

std::string value_name(float v) { return std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf"; }

}  // namespace

std::string divergence_line(std::span<const LossFinding> per_rank, const std::string& tensor, const StepPlace& step,
                            const std::string& checkpoints) {
  const LossFinding* first = nullptr;
  std::vector<int> ranks;
  for (size_t r = 0; r < per_rank.size(); ++r) {
    if (!per_rank[r].found) continue;
    ranks.push_back(static_cast<int>(r));
    if (!first || per_rank[r].first.step < first->first.step) first = &per_rank[r];
  }
  std::string what;
  if (first && first->exact) {
    what = fmt::format("the loss is {} at step {} (epoch {}, batch {})", value_name(first->value), first->first.step,
                       first->first.epoch + 1, first->first.batch);
  } else if (first) {
    // A device's losses are summed and read at votes: the step is one of a range.
    what = fmt::format("the loss is {} at a step from {} (epoch {}, batch {}) to {}", value_name(first->value),
                       first->first.step, first->first.epoch + 1, first->first.batch, first->last.step);
  }
  if (first) what += fmt::format(" on rank(s) {}", fmt::join(ranks, ", "));
  // `tensor` names a file of the snapshot ("model.safetensors: ...") or, in a run that saves
  // nothing, a parameter checked at the end ("parameter 1.weight: ...").
  if (!tensor.empty())
    what += fmt::format("{}{} not finite after step {} (epoch {}, batch {}): {}", first ? "; " : "",
                        tensor.starts_with("parameter ") ? "a parameter is" : "the state to checkpoint is", step.step,
                        step.epoch + 1, step.batch, tensor);
  return fmt::format("training diverged: {}; {}", what, checkpoints);
}

}  // namespace dtrain
