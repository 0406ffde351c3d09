#include "app/train_step.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>

#include <fmt/format.h>

#include "core/error.h"
#include "core/kernels.h"
#include "core/ops.h"

namespace dtrain {

MicroBatch micro_batch(int64_t i, int64_t batches, int64_t accumulate) {
  const int64_t micro = i % accumulate;
  return {micro, std::min(accumulate, batches - (i - micro)), micro == accumulate - 1 || i == batches - 1};
}

Tensor forward_backward(Module& model, DistributedDataParallel* ddp, CrossEntropyLoss& loss_fn, Tracer& tracer,
                        const Tensor& input, const Tensor& targets, const MicroStep& micro) {
  Tensor logits;
  {
    // A micro-batch that does not end its step runs forward and backward under no_sync(): its
    // forward leaves the next one without DDP's buffer broadcast (Note [Buffer broadcast]).
    std::optional<DistributedDataParallel::NoSyncGuard> no_sync;
    if (ddp && !micro.ends_step) no_sync.emplace(*ddp);
    ScopedSpan span(&tracer, "forward");
    logits = ddp ? ddp->forward(input) : model.forward(input);
  }
  Tensor loss = loss_fn.forward(logits, targets);
  Tensor grad = loss_fn.backward();
  // The step sees the mean over its micro-batches; fp16 scales the loss in the same pass.
  if (micro.step_size > 1 || micro.loss_scale != 1.f)
    scale(grad, micro.loss_scale / static_cast<float>(micro.step_size));
  if (!ddp) {
    ScopedSpan span(&tracer, "backward");
    model.backward(grad, false);
  } else if (micro.ends_step) {
    ddp->backward(grad);
    tracer.add_backward(ddp->last_backward());
  } else {
    auto guard = ddp->no_sync();
    ScopedSpan span(&tracer, "backward (no_sync)");
    ddp->backward(grad);
  }
  return loss;
}

std::function<float(float)> host_sum_over_ranks(Communicator& comm) {
  return [&comm](float x) {
    if (comm.size() > 1) comm.allreduce(&x, 1, DType::kF32, ReduceOp::kSum);
    return x;
  };
}

GradPoison::GradPoison(const char* spec, int rank) {
  if (!spec || !*spec) return;
  const std::string text = spec;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, end - start);
    const size_t at = item.find('@');
    long long step = 0, on_rank = -1;
    try {
      size_t used = 0;
      step = std::stoll(item.substr(0, at), &used);
      if (used != std::min(at, item.size())) step = 0;
      if (at != std::string::npos) on_rank = std::stoll(item.substr(at + 1), &used);
      if (at != std::string::npos && used != item.size() - at - 1) step = 0;
    } catch (const std::exception&) {
      step = 0;
    }
    if (step <= 0) throw UsageError(fmt::format("{}: expected steps like 3,7@1, got '{}'", kEnv, text));
    if (on_rank < 0 || on_rank == rank) steps_.push_back(step);
    start = end + 1;
  }
}

bool GradPoison::hits(int64_t step) const {
  for (int64_t s : steps_)
    if (s == step) return true;
  return false;
}

void GradPoison::poison(const std::vector<Parameter*>& params) {
  // The first gradient this rank steps with (under ZeRO-2's ring, its owned ones).
  const std::vector<GradSpan> spans = written_grads(params);
  if (!spans.empty())
    launch(params.front()->value.device(), 1, kernels::Fill{spans.front().data, std::numeric_limits<float>::infinity()});
}

StepGate::StepGate(const TrainConfig& c, Runtime& runtime, std::vector<Parameter*> params)
    : params_(std::move(params)), poison_(std::getenv(GradPoison::kEnv), runtime.rank()) {
  if (c.amp == AmpMode::kFp16) scaling_.emplace(runtime.control(), c.loss_scale, runtime.device());
}

bool StepGate::pass(int64_t step) {
  if (poison_.hits(step)) GradPoison::poison(params_);
  if (!scaling_) return true;
  return scaling_->unscale_and_agree(written_grads(params_));
}

nlohmann::json StepGate::state_json() const {
  if (!scaling_) return nullptr;
  const GradScalerState& s = scaling_->scaler().state();
  return {{"scale", s.scale}, {"growth_tracker", s.growth_tracker}, {"skipped_steps", s.skipped_steps}};
}

void StepGate::restore(const nlohmann::json& saved, const std::string& source) {
  if (!scaling_ || saved.is_null()) return;
  const auto fail = [&](const char* field, const char* problem) {
    throw Error(fmt::format("{}: grad_scaler.{}: {}", source, field, problem));
  };
  if (!saved.is_object()) fail("", "expected an object");
  GradScalerState s;
  const auto number = [&](const char* field) -> const nlohmann::json& {
    if (!saved.contains(field) || !saved[field].is_number()) fail(field, "expected a number");
    return saved[field];
  };
  s.scale = number("scale").get<float>();
  if (!(s.scale > 0.f) || !std::isfinite(s.scale)) fail("scale", "expected a positive finite number");
  for (auto [field, value] : {std::pair{"growth_tracker", &s.growth_tracker}, {"skipped_steps", &s.skipped_steps}}) {
    if (!number(field).is_number_integer() || number(field).get<int64_t>() < 0)
      fail(field, "expected a whole number >= 0");
    *value = number(field).get<int64_t>();
  }
  scaling_->scaler().set_state(s);
}

std::string StepGate::take_warning() {
  if (!scaling_ || warned_ || scaling_->scale() >= 1.f) return "";
  warned_ = true;
  return fmt::format("warning: the fp16 loss scale fell below 1 ({:g}, {} step(s) skipped): gradients overflow "
                     "fp16 even unscaled; the run is probably diverging",
                     scaling_->scale(), scaling_->scaler().state().skipped_steps);
}

}  // namespace dtrain
