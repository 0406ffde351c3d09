#include "app/checkpointing.h"

#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "checkpoint/checkpoint_layout.h"
#include "train/root_broadcast.h"

namespace dtrain {

using nlohmann::json;

namespace {

// A float as the shortest decimal that reads back to it (0.01, not 0.009999999776482582), so
// that state.json and its error lines show what the user typed.
double decimal(float v) { return std::strtod(fmt::format("{}", v).c_str(), nullptr); }

json lr_schedule_config(const TrainConfig& c) {
  json s = {{"kind", lr_schedule_name(c.lr_schedule)}};
  if (c.lr_schedule == LrSchedule::Kind::kStep) {
    s["step_size"] = c.lr_step_size;
    s["step_gamma"] = decimal(c.lr_gamma);  // named so that "kind" sorts first
  }
  if (c.lm) {  // per step: the whole curve depends on the run's length
    s["steps"] = c.lm->steps;
    s["warmup_steps"] = c.warmup_steps;
    if (c.lr_schedule == LrSchedule::Kind::kCosine) s["min_lr"] = decimal(c.min_lr);
    return s;
  }
  if (c.lr_schedule == LrSchedule::Kind::kCosine) s["period_epochs"] = c.epochs;  // the schedule's T_max
  return s;
}

json optimizer_config(const OptimizerSpec& o) {
  // "algorithm" sorts first, so that another optimizer is reported as such.
  json j = {{"algorithm", optimizer_name(o.kind)}, {"lr", decimal(o.lr)}, {"weight_decay", decimal(o.weight_decay)}};
  if (o.kind == OptimizerKind::kSgd) {
    j["momentum"] = decimal(o.momentum);
    j["nesterov"] = o.nesterov;
  } else {
    j["eps"] = decimal(o.eps);
    // Only when they differ from the defaults: checkpoints written before the flags still match.
    if (o.beta2 != OptimizerSpec{}.beta2) j["beta2"] = decimal(o.beta2);
    if (o.decay_matrices_only) j["decay"] = "matrices only";
  }
  return j;
}

}  // namespace

json bucket_layout_json(const BucketLayout& layout) {
  return {{"ready_order", layout.ready_order},
          {"first_bucket_bytes", layout.first_bucket_bytes},
          {"bucket_cap_bytes", layout.bucket_cap_bytes}};
}

BucketLayout bucket_layout_from_json(const json& buckets, size_t params, const std::string& source) {
  auto fail = [&](const std::string& field, const std::string& problem) {
    throw Error(fmt::format("{}: buckets{}: {}", source, field, problem));
  };
  if (!buckets.is_object()) fail("", "expected an object");
  auto bytes = [&](const char* name) {
    const json* v = buckets.contains(name) ? &buckets[name] : nullptr;
    if (!v || !v->is_number_integer() || v->get<int64_t>() <= 0)
      fail(fmt::format(".{}", name), "expected a positive whole number");
    return v->get<size_t>();
  };
  BucketLayout layout;
  layout.first_bucket_bytes = bytes("first_bucket_bytes");
  layout.bucket_cap_bytes = bytes("bucket_cap_bytes");
  const json* order = buckets.contains("ready_order") ? &buckets["ready_order"] : nullptr;
  if (!order || !order->is_array()) fail(".ready_order", "expected an array of parameter indices");
  for (const json& i : *order) {
    if (!i.is_number_integer() || i.get<int64_t>() < 0)
      fail(".ready_order", fmt::format("{} is not a parameter index", i.dump()));
    layout.ready_order.push_back(i.get<size_t>());
  }
  const std::string wrong = check_ready_order(layout.ready_order, params);
  if (!wrong.empty()) fail(".ready_order", wrong);
  return layout;
}

json resume_config(const TrainConfig& c) {
  // "architecture" sorts first, so that another model is reported as such, not by its widths.
  json model = {{"architecture", model_kind_name(c.model.kind)}, {"dropout", decimal(c.model.dropout)}};
  if (c.model.kind == ModelKind::kMlp) model["hidden"] = c.model.hidden;
  if (c.model.kind == ModelKind::kResnet18) model["width"] = c.model.width;
  if (c.data.classes > 0) model["classes"] = c.data.classes;  // only when given: older checkpoints still match
  if (c.lm)  // the vocabulary is checked by the tensors' shapes (it may come from the data)
    model = {{"architecture", "gpt"}, {"layers", c.lm->layers}, {"heads", c.lm->heads}, {"embd", c.lm->embd},
             {"context", c.lm->context}};
  json out = {
      {"model", model},
      {"optimizer", optimizer_config(c.optimizer)},
      {"lr_schedule", lr_schedule_config(c)},
      {"batch_size", c.batch_size},
      {"accumulate", c.accumulate},
      {"amp", std::string(amp_name(c.amp))},
      {"ddp",
       {{"comm_hook", comm_hook_name(c.ddp.comm_hook)},
        {"bucket_cap_bytes", c.ddp.bucket_cap_auto ? json("auto") : json(c.ddp.bucket_cap_bytes)},
        {"first_bucket_bytes", c.ddp.first_bucket_bytes}}},
      {"data",
       {{"train_limit", c.data.train_limit},
        {"test_limit", c.data.test_limit},
        {"normalize", {decimal(c.data.normalize.mean), decimal(c.data.normalize.std)}},
        {"shuffle", c.data.shuffle},
        {"sampler", sampler_tail_name(c.data.sampler)}}},
      {"seed", c.seed},
  };
  if (c.clip_grad_norm > 0.f) out["clip_grad_norm"] = decimal(c.clip_grad_norm);
  if (!c.class_weights.empty()) {  // only when given: older checkpoints still match
    json weights = json::array();
    for (float w : c.class_weights) weights.push_back(decimal(w));
    out["class_weights"] = weights;
  }
  if (c.amp == AmpMode::kFp16)  // only then: older checkpoints still match
    out["loss_scale"] = {{"scale", c.loss_scale.dynamic ? json("dynamic") : json(decimal(c.loss_scale.init_scale))},
                         {"growth_interval", c.loss_scale.growth_interval}};
  if (c.lm) out["data"] = {{"format", "llmc"}, {"shuffle", c.data.shuffle}};  // the image settings mean nothing here
  return out;
}

checkpoint::TrainingState position_state(const RunPosition& pos, const TrainConfig& c, int world_size, float lr) {
  checkpoint::TrainingState s;
  s.epoch = pos.epoch;
  s.step_in_epoch = pos.step_in_epoch;
  s.sample_in_epoch = pos.sample_in_epoch;
  s.global_step = pos.global_step;
  s.samples_seen = pos.samples_seen;
  s.world_size = world_size;
  s.pipeline_stages = c.pipeline.stages;
  s.seed = c.seed;
  s.lr_schedule_position = pos.epoch;  // the schedules are per epoch
  s.lr = lr;
  s.config = resume_config(c);
  return s;
}

RunPosition position_of(const checkpoint::TrainingState& s, int64_t train_samples, const std::string& source) {
  if (s.sample_in_epoch > train_samples)
    throw Error(fmt::format("{}: sample_in_epoch {} is past the end of an epoch of the {} training samples (a "
                            "checkpoint of other data?)",
                            source, s.sample_in_epoch, train_samples),
                ErrorKind::kCheckpoint);
  return {s.epoch, s.step_in_epoch, s.sample_in_epoch, s.global_step, s.samples_seen};
}

std::optional<LayoutChange> layout_change(const checkpoint::TrainingState& saved, int world_size, int pipeline_stages) {
  if (saved.world_size == world_size && saved.pipeline_stages == pipeline_stages) return std::nullopt;
  const bool grids = saved.pipeline_stages != 1 || pipeline_stages != 1;  // Note [Resume layout]
  const auto layout = [grids](int64_t world, int64_t stages) {
    return grids ? fmt::format("{} (P {} x D {})", world, stages, world / stages) : fmt::format("{}", world);
  };
  return LayoutChange{layout(saved.world_size, saved.pipeline_stages), layout(world_size, pipeline_stages)};
}

std::string image_resume_layout_note(const checkpoint::TrainingState& s, int world_size, int pipeline_stages) {
  const std::optional<LayoutChange> change = layout_change(s, world_size, pipeline_stages);
  if (!change) return "";
  return fmt::format(
      "resume: saved at world size {}, running at {}: the rest of epoch {} continues from sample {} of the same "
      "order, every remaining sample used once; not bitwise identical to continuing at world size {} (batches "
      "group differently)",
      change->saved, change->running, s.epoch + 1, s.sample_in_epoch, change->saved);
}

CheckpointerOptions checkpointer_options(const CheckpointSettings& settings) {
  return {.dir = settings.dir,
          .keep = settings.keep,
          .background = settings.background,
          .in_use_hint = "one job per --checkpoint-dir"};
}

std::optional<ResumedRun> restore_checkpoint(Communicator& control, const TrainConfig& c, Module& model,
                                             Optimizer& optimizer, DistributedDataParallel* ddp,
                                             const StageOf& stage_of) {
  const CheckpointSettings& k = c.checkpoints;
  if (k.resume == ResumeMode::kNone) return std::nullopt;
  const nlohmann::json config = resume_config(c);
  std::optional<BucketLayout> buckets;
  // Note [Sharded optimizer state]: the layout first (the optimizer holds no state yet, so
  // re-laying the store moves nothing between ranks), then the pieces of it this rank owns.
  const PiecesFor pieces_for = [&](const Resumed& r) -> WantedPieces {
    // A pipeline stage has no buckets (a data-parallel run's layout means nothing to it) and
    // asks for its own parameters' state.
    if (!stage_of.tensors.empty()) return wanted_pieces(optimizer);
    // Every rank read the same state.json: a layout that does not fit fails alike everywhere.
    if (!r.state.buckets.is_null()) {
      buckets = bucket_layout_from_json(r.state.buckets, model.parameters().size(),
                                        (std::filesystem::path(r.path) / checkpoint::kStateFile).string());
      if (ddp) ddp->set_bucket_layout(*buckets);  // the saving run's choice: the same buckets, no trials
    } else if (ddp && c.ddp.zero_stage > 0) {
      // A checkpoint without buckets (a one-rank run's): keep today's layout for good. A rebuild
      // after the first backward would move imported state between ranks, which one rank may
      // refuse while the others wait in a collective.
      ddp->set_bucket_layout(ddp->bucket_layout());
    }
    if (!ddp || c.ddp.zero_stage == 0) return std::nullopt;  // every tensor whole
    return wanted_pieces(optimizer);
  };
  std::optional<Resumed> resumed =
      k.resume == ResumeMode::kAuto
          ? restore_newest(control, k.dir, model, optimizer, config, pieces_for, stage_of)
          : restore_from(control, k.resume_path, model, optimizer, config, pieces_for, stage_of);
  if (!resumed) return std::nullopt;
  return ResumedRun{std::move(*resumed), buckets};
}

}  // namespace dtrain
