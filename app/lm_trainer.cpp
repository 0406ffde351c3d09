#include "app/lm_trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <span>

#include <fmt/format.h>

#include "app/architecture.h"
#include "app/checkpointing.h"
#include "app/evaluate.h"
#include "app/lm_batches.h"
#include "app/memory_report.h"
#include "app/preemption.h"
#include "app/progress.h"
#include "app/rank_agreement.h"
#include "app/reporter.h"
#include "app/run_control.h"
#include "comm/launch_channel.h"
#include "app/sample_log.h"
#include "app/trace.h"
#include "app/train_options.h"
#include "app/train_step.h"
#include "comm/exchange.h"
#include "comm/mpi_lifecycle.h"
#include "core/memory.h"
#include "model/fingerprint.h"
#include "model/gpt.h"
#include "model/grad_clip.h"
#include "model/loss.h"
#include "train/root_broadcast.h"

namespace dtrain {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Note [A language model's position]: a run stands at optimizer step `step` having consumed g0
// training slots over all ranks (--accumulate slots per rank per step). Micro-batch m of the next
// step reads slot g = g0 + m*N + r on rank r, so the slots of a step are consecutive in the slot
// order whatever N is: a run resumed at another world size continues at g0, every slot once.
// In state.json the step is global_step and g0 is samples_seen (and sample_in_epoch): a "sample"
// of a language model is a slot of B sequences.
struct LmPosition {
  int64_t step = 0;   // optimizer steps done
  int64_t slots = 0;  // g0: training slots consumed by all ranks
};

class LmTrainer {
 public:
  LmTrainer(Runtime& runtime, const TrainConfig& config);
  TrainResult run();

 private:
  void choose_starting_point();
  // One optimizer step of --accumulate micro-batches; returns the last micro-batch's loss.
  Tensor train_step();
  // The mean loss over --eval-batches validation slots, each rank taking i = r, r+N, ...; collective.
  double validation_loss();
  checkpoint::TrainingState training_state() const;

  Runtime& rt_;
  const TrainConfig& c_;
  const LmSettings& lm_;
  LmBatches data_;
  std::unique_ptr<Gpt> model_;
  std::optional<DistributedDataParallel> ddp_;
  std::unique_ptr<Optimizer> optimizer_;
  std::optional<GradNormClipper> clipper_;
  std::optional<StepGate> gate_;  // --amp fp16's loss scaling
  StepLrSchedule schedule_;
  CrossEntropyLoss loss_fn_;
  Tracer tracer_;
  Reporter reporter_;
  LmPosition pos_;
  SampleLog sample_log_;  // the slots each rank reads (a test hook)
  std::optional<RunControl> control_;
};

LmTrainer::LmTrainer(Runtime& runtime, const TrainConfig& c)
    : rt_(runtime),
      c_(c),
      lm_(*c.lm),
      data_(open_lm_batches(runtime, c)),
      model_(build_gpt(gpt_spec(lm_, data_.vocab()), runtime.device(), c.seed,
                       c.model.memory_budget_bytes > 0 ? c.model.memory_budget_bytes
                                                       : host_memory_bytes() / std::max(1, runtime.local_size()),
                       runtime.size(), c.ddp.zero_stage)),
      schedule_{c.optimizer.lr, c.min_lr, c.warmup_steps, lm_.steps, c.lr_schedule == LrSchedule::Kind::kCosine},
      tracer_(!c.output.trace_path.empty()),
      reporter_(c.output, runtime.rank() == 0, progress_wanted_here(c.output.progress)),
      sample_log_(runtime.rank()) {
  // Before the first collective whose count or shape a setting decides: ranks started with other
  // flags (or other shards) fail here, in one line.
  check_ranks_agree(runtime.control(), shared_settings(c, data_.train_tokens(), data_.val_tokens()));
  loss_fn_ = CrossEntropyLoss(Reduction::kMean, check_class_weights(c, data_.vocab(), "token ids of the vocabulary"));
  model_->set_amp(c.amp);
  if (runtime.size() > 1) {
    DdpOptions ddp = c.ddp;
    ddp.device_timing = c.runtime.device_timing;  // --trace or --metrics (app/train_options.cpp)
    ddp_.emplace(*model_, runtime, ddp);
  }
  optimizer_ = make_optimizer(c.optimizer, model_->parameters());
  if (c.clip_grad_norm > 0.f) clipper_.emplace(model_->parameters(), host_sum_over_ranks(runtime.control()));
  gate_.emplace(c, runtime, model_->parameters());
  reporter_.watch_loss_scale(gate_->state());
  control_.emplace(runtime, c, *model_, *optimizer_, reporter_, gpt_architecture_metadata(gpt_spec(lm_, data_.vocab())),
                   RunControl::Callbacks{[this] { return training_state(); },
                                         [this] { return fmt::format("step {} (slot {})", pos_.step, pos_.slots); },
                                         "no checkpoint of this step"});
  choose_starting_point();
}

void LmTrainer::choose_starting_point() {
  const std::optional<ResumedRun> resumed = control_->read_starting_point(*optimizer_, ddp_ ? &*ddp_ : nullptr);
  int64_t parameters = 0;
  for (Parameter* p : model_->parameters()) parameters += p->value.numel();
  reporter_.start_lm(rt_, model_->describe(), c_, data_.train_tokens(), data_.val_tokens(), parameters);
  reporter_.note(memory_line(*optimizer_, ddp_ ? c_.ddp.zero_stage : 0, rt_.size()));
  control_->announce_start(resumed, ddp_ ? &*ddp_ : nullptr);
  if (!resumed) return;
  const checkpoint::TrainingState& s = resumed->state;
  gate_->restore(s.grad_scaler, resumed->path + "/state.json");
  pos_ = {s.global_step, s.samples_seen};
  note_lm_resume(reporter_, *resumed, c_, rt_.size());
}

Tensor LmTrainer::train_step() {
  const int64_t world = rt_.size();
  optimizer_->zero_grad();
  Tensor loss;
  for (int64_t m = 0; m < c_.accumulate; ++m) {
    const bool ends_step = m + 1 == c_.accumulate;
    const int64_t g = pos_.slots + m * world + rt_.rank();  // Note [A language model's position]
    data_.stage_train(g);
    data_.prefetch_train(g + world);  // the next micro-batch's slot: its copy overlaps this one (CUDA)
    if (sample_log_.enabled()) {  // the slot read, not the counter: they differ when shuffled
      const int64_t slot = data_.train_slot(g);
      sample_log_.record(0, pos_.step + 1, std::span(&slot, 1));
    }
    loss = forward_backward(*model_, ddp_ ? &*ddp_ : nullptr, loss_fn_, tracer_, data_.inputs(), data_.targets(),
                            {c_.accumulate, ends_step, gate_->loss_scale()});
    control_->record_loss(loss, {pos_.step + 1, 0, pos_.step + 1});
  }
  const bool take = gate_->pass(pos_.step + 1);  // fp16: unscale, check, the ranks' vote
  reporter_.note(gate_->take_warning());
  optimizer_->set_lr(static_cast<float>(schedule_.lr_at(pos_.step)));
  if (take) {
    if (clipper_) clipper_->clip(c_.clip_grad_norm);  // after the all-reduce: the same on every rank
    ScopedSpan span(&tracer_, "optimizer step");
    optimizer_->step();
  }
  if (ddp_)
    for (const std::string& note : ddp_->take_bucket_notes()) reporter_.note(note);
  ++pos_.step;
  pos_.slots += c_.accumulate * world;
  return loss;
}

double LmTrainer::validation_loss() {
  return lm_validation_loss(*model_, data_, std::min(lm_.eval_batches, data_.val_slots()), rt_.control());
}

checkpoint::TrainingState LmTrainer::training_state() const {
  checkpoint::TrainingState s = lm_training_state(pos_.step, pos_.slots, c_, rt_.size(), schedule_);
  if (ddp_ && ddp_->bucket_layout_final()) s.buckets = bucket_layout_json(ddp_->bucket_layout());
  s.grad_scaler = gate_->state_json();
  return s;
}

TrainResult LmTrainer::run() {
  TrainResult result;
  result.world_size = rt_.size();
  result.device = rt_.device().str();
  for (Parameter* p : model_->parameters()) result.parameters += p->value.numel();
  const double tokens_per_step = static_cast<double>(c_.batch_size * lm_.context * c_.accumulate * rt_.size());
  const int64_t first_step = pos_.step;  // resumed runs time only their own steps
  const auto start = Clock::now();
  auto interval_start = start;
  int64_t interval_steps = 0;
  double eval_seconds = 0;
  Tensor loss;
  bool stopped = false;
  while (pos_.step < lm_.steps) {
    set_collective_context(fmt::format("step {}", pos_.step + 1));
    control_->begin_step();
    loss = train_step();
    control_->end_step({pos_.step, 0, pos_.step});
    ++interval_steps;
    const bool last = pos_.step == lm_.steps;
    if (reporter_.draws_progress()) {  // rates over this run's steps, evaluations left out
      const double run_seconds = seconds_since(start) - eval_seconds;
      const double steps_per_s = run_seconds > 0 ? static_cast<double>(pos_.step - first_step) / run_seconds : 0;
      reporter_.lm_progress({pos_.step, lm_.steps, tokens_per_step * steps_per_s, 0.f, schedule_.lr_at(pos_.step - 1),
                             steps_per_s > 0 ? static_cast<double>(lm_.steps - pos_.step) / steps_per_s : 0},
                            loss);
    }
    if (pos_.step % c_.output.log_interval == 0 || pos_.step == 1 || last) {
      const float loss_now = loss_value(loss);  // a device-to-host copy: waits for the step
      const double seconds = seconds_since(interval_start);
      reporter_.lm_step({pos_.step, lm_.steps, loss_now, clipper_ ? clipper_->last_norm() : -1.f,
                         schedule_.lr_at(pos_.step - 1), 1e3 * seconds / static_cast<double>(interval_steps),
                         tokens_per_step * static_cast<double>(interval_steps) / seconds});
      interval_start = Clock::now();
      interval_steps = 0;
    }
    if (last || (lm_.eval_every > 0 && pos_.step % lm_.eval_every == 0)) {
      const auto t0 = Clock::now();
      set_collective_context(fmt::format("step {} evaluation", pos_.step));
      result.val_loss = validation_loss();
      reporter_.lm_eval(pos_.step, result.val_loss);
      eval_seconds += seconds_since(t0);
      interval_start = Clock::now();
    }
    const CheckpointSettings& k = c_.checkpoints;
    if (!control_->at_step_boundary({.global_step = pos_.step,
                                     .run_end = last,
                                     .due = k.every > 0 && pos_.step % k.every == 0,
                                     .can_save = true})) {
      stopped = true;
      break;
    }
  }
  rt_.compute_stream().synchronize();
  result.train_seconds = seconds_since(start) - eval_seconds;
  result.stop_signal = control_->stopped_by();
  result.diverged = control_->diverged();
  control_->finish();
  result.global_step = pos_.step;
  if (stopped) return result;
  float mean_loss = loss.defined() ? loss_value(loss) : 0.f;  // this rank's last loss, then the mean over ranks
  rt_.control().allreduce(&mean_loss, 1, DType::kF32, ReduceOp::kSum);
  result.train_loss = mean_loss / static_cast<float>(rt_.size());
  if (!loss.defined()) result.val_loss = validation_loss();  // resumed at the end: nothing trained
  result.tokens_per_second =
      result.train_seconds > 0 ? tokens_per_step * static_cast<double>(lm_.steps - first_step) / result.train_seconds : 0;
  control_->write_trace(tracer_, result);
  result.parameters_fingerprint = parameters_fingerprint(*model_);
  reporter_.finish_lm(result);
  return result;
}

}  // namespace

checkpoint::TrainingState lm_training_state(int64_t step, int64_t slots, const TrainConfig& c, int world_size,
                                            const StepLrSchedule& schedule) {
  checkpoint::TrainingState s;  // Note [A language model's position]
  s.epoch = 0;
  s.step_in_epoch = step;
  s.sample_in_epoch = slots;
  s.global_step = step;
  s.samples_seen = slots;
  s.world_size = world_size;
  s.pipeline_stages = c.pipeline.stages;
  s.seed = c.seed;
  s.lr_schedule_position = step;
  s.lr = static_cast<float>(schedule.lr_at(std::max<int64_t>(step - 1, 0)));
  s.config = resume_config(c);
  return s;
}

void note_lm_resume(Reporter& reporter, const ResumedRun& resumed, const TrainConfig& c, int world_size) {
  const checkpoint::TrainingState& s = resumed.state;
  reporter.note(fmt::format("resume: from {} (step {}, {} slots consumed){}", resumed.path, s.global_step,
                            s.samples_seen, c.checkpoints.init_weights.empty() ? "" : "; --init-weights not used"));
  // Note [Resume layout] (app/checkpointing.h): the pipeline's grid counts, not only the world size.
  if (const std::optional<LayoutChange> change = layout_change(s, world_size, c.pipeline.stages))
    reporter.note(fmt::format("resume: saved at world size {}, running at {}: continuing from slot {}, every slot "
                              "once; not bitwise identical to continuing at world size {}",
                              change->saved, change->running, s.samples_seen, change->saved));
  if (s.global_step >= c.lm->steps)
    reporter.note(fmt::format("resume: the checkpoint has done {} of --steps {}: nothing left to train",
                              s.global_step, c.lm->steps));
}

GptSpec gpt_spec(const LmSettings& lm, int64_t vocab) {
  GptSpec spec;
  spec.vocab = vocab;
  spec.context = lm.context;
  spec.layers = lm.layers;
  spec.heads = lm.heads;
  spec.embd = lm.embd;
  return spec;
}

TrainResult train_language_model(Runtime& runtime, const TrainConfig& config) {
  LmTrainer trainer(runtime, config);
  report_reached_training();  // Note [Reaching training] in app/trainer.h
  return trainer.run();
}

}  // namespace dtrain
