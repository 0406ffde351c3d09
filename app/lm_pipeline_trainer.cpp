#include "app/lm_pipeline_trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <span>

#include <fmt/format.h>

#include "app/architecture.h"
#include "app/checkpointing.h"
#include "app/lm_batches.h"
#include "app/lm_trainer.h"
#include "app/memory_report.h"
#include "app/pipeline_report.h"
#include "app/pipeline_trainer.h"
#include "app/pipeline_zero.h"
#include "app/train_options.h"
#include "app/rank_agreement.h"
#include "app/preemption.h"
#include "app/progress.h"
#include "app/reporter.h"
#include "app/sample_log.h"
#include "app/trace.h"
#include "app/train_step.h"
#include "comm/flight_recorder.h"
#include "comm/launch_channel.h"
#include "core/error.h"
#include "core/memory.h"
#include "model/fingerprint.h"
#include "model/loss.h"
#include "model/lr_schedule.h"
#include "model/optimizer.h"
#include "pipeline/gpt_stage.h"
#include "pipeline/pipeline_clip.h"
#include "pipeline/pipeline_stage.h"
#include "train/checkpointer.h"
#include "train/root_broadcast.h"

namespace dtrain {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The mean validation loss over `batches` slots: replica d takes i = d, d + D, ...; the last
// stage's sum over the replicas (elsewhere 0). Collective over every stage of every replica.
double pipeline_validation_loss(PipelineStage& stage, LmBatches& data, int64_t batches) {
  const PipelineGrid& g = stage.grid();
  double sum = 0;
  for (int64_t i = g.replica; i < batches; i += g.replicas) {
    data.stage_val(i);
    const PipelineStage::Evaluated e = stage.evaluate_batch(data.inputs(), data.targets());
    sum += e.loss_sum / static_cast<double>(data.targets().numel());  // the slot's mean
  }
  if (g.stage != g.stages - 1) return 0;
  float total = static_cast<float>(sum);
  g.data_parallel->allreduce(&total, 1, DType::kF32, ReduceOp::kSum);
  return static_cast<double>(total) / static_cast<double>(batches);
}

}  // namespace

TrainResult train_language_model_pipeline(Runtime& rt, const TrainConfig& c) {
  const PipelineSettings& p = c.pipeline;
  const LmSettings& lm = *c.lm;
  LmBatches data = open_lm_batches(rt, c);
  check_ranks_agree(rt.control(), shared_settings(c, data.train_tokens(), data.val_tokens()));
  const GptSpec spec = gpt_spec(lm, data.vocab());
  std::vector<StageRange> ranges;
  try {
    ranges = gpt_stage_ranges(spec, p.stages, p.split);
  } catch (const Error& e) {
    throw Error(fmt::format("{} {}: {} (the GPT's layers: 0 the embeddings, 1..{} the blocks, {} ln_f and the head)",
                            p.split.empty() ? "--pipeline-stages" : "--pipeline-split",
                            p.split.empty() ? fmt::format("{}", p.stages) : fmt::format("{}", fmt::join(p.split, ",")),
                            e.what(), lm.layers, lm.layers + 1),
                ErrorKind::kUsage);
  }
  PipelineGrid grid = make_trainer_grid(rt, c);
  const StageRange mine = ranges.at(static_cast<size_t>(grid.stage));
  // The memory check counts this stage's layers only; a stage that does not fit stops every rank
  // alike (the others would wait for it in their first collective).
  agreed_across_ranks(rt.control(), [&] {
    check_model_fits("gpt", plan_gpt_stage(spec, mine),
                     c.model.memory_budget_bytes > 0 ? c.model.memory_budget_bytes
                                                     : host_memory_bytes() / std::max(1, rt.local_size()));
  });
  std::unique_ptr<Sequential> layers = build_gpt_stage(spec, rt.device(), c.seed, mine);
  // The optimizer holds the stage's parameters (their addresses do not move with the layers).
  std::unique_ptr<Optimizer> optimizer = make_optimizer(c.optimizer, layers->parameters());
  // Note [Pipeline ZeRO-1] (app/pipeline_zero.h), as the image pipeline's: the first and the last
  // stage each shard their copy of the tied wte over their own replicas.
  // --zero 2: each replica's two ends add their local wte gradients before the reduce-scatter
  // (Note [Tied stages] in pipeline/pipeline_stage.h).
  const bool reduce_scatter = c.ddp.zero_stage == 2 && grid.replicas > 1;
  std::optional<StageZero> zero;
  if (c.ddp.zero_stage > 0 && grid.replicas > 1) zero.emplace(*layers, grid, reduce_scatter);
  // Note [Pipeline checkpoints] (train/checkpointer.h): the unsplit GPT's tensors (wte once, as
  // Gpt saves it); a checkpoint of any P x D (P = 1 included), this stage taking its own tensors
  // (the head its copy of wte), else --init-weights likewise, else the seeded initialisation.
  std::vector<safetensors::TensorSpec> whole;
  for (const LayerSize& l : plan_gpt(spec))
    for (const ParameterShape& t : l.tensors) whole.push_back({t.name, safetensors::Dtype::kF32, t.shape});
  const CheckpointSettings& k = c.checkpoints;
  Checkpointer saver(rt.control(), checkpointer_options(k));
  const std::optional<ResumedRun> resumed = classify_errors(
      ErrorKind::kCheckpoint,
      [&] { return restore_checkpoint(rt.control(), c, *layers, *optimizer, nullptr, StageOf(whole)); });
  if (!resumed && !k.init_weights.empty())
    classify_errors(ErrorKind::kCheckpoint, [&] { load_stage_weights(rt.control(), k.init_weights, *layers, whole); });
  PipelineOptions stage_options{p.schedule, p.micro_batches, kGptTiedParameter};
  stage_options.device = rt.device();
  stage_options.sum_gradients = !reduce_scatter;  // ZeRO-2 sums them itself
  // Note [Pipeline class weights] (pipeline/pipeline_stage.h): per token id, over the global batch.
  stage_options.class_weights = check_class_weights(c, data.vocab(), "token ids of the vocabulary");
  PipelineStage stage(std::move(layers), grid, stage_options);
  // Note [Pipeline gradient norm] (pipeline/pipeline_clip.h).
  std::optional<PipelineClipper> clipper;
  if (c.clip_grad_norm > 0.f) clipper.emplace(rt.control(), stage);
  // --amp: as the image pipeline's (app/pipeline_trainer.cpp); both copies of the tied wte are
  // checked, and they hold the same bits.
  stage.module().set_amp(c.amp);
  StepGate gate(c, rt, stage.module().parameters());
  const StepLrSchedule schedule{c.optimizer.lr, c.min_lr, c.warmup_steps, lm.steps,
                                c.lr_schedule == LrSchedule::Kind::kCosine};
  const bool last = grid.stage == grid.stages - 1;
  // The progress line as the data-parallel GPT draws it (app/lm_trainer.cpp), by the rank that logs.
  const bool logger = last && grid.replica == 0;
  Reporter reporter(c.output, logger, logger && progress_wanted_here(c.output.progress));
  reporter.watch_loss_scale(gate.state());
  int64_t parameters = 0;
  for (const LayerSize& l : plan_gpt(spec)) parameters += l.parameters;
  reporter.start_lm(rt, fmt::format("Gpt(vocab={}, context={}, layers={}, heads={}, embd={})", spec.vocab,
                                    spec.context, spec.layers, spec.heads, spec.embd),
                    c, data.train_tokens(), data.val_tokens(), parameters);
  // Note [A language model's position] (app/lm_trainer.cpp) with N = D: accumulated batch a of a
  // step reads slot g0 + a x D + d on replica d, g0 the slots consumed (A x D per step), so the
  // slots are the unsplit GPT's at np D with --accumulate A.
  int64_t step = 0, slots = 0;
  if (resumed) {
    step = resumed->state.global_step;
    slots = resumed->state.samples_seen;
    gate.restore(resumed->state.grad_scaler, resumed->path + "/state.json");  // fp16's scale and streak
    if (!resumed->chosen_because.empty()) reporter.note("resume: " + resumed->chosen_because);
    note_lm_resume(reporter, *resumed, c, rt.size());
  } else if (k.resume == ResumeMode::kAuto) {
    reporter.note(fmt::format("resume: no checkpoint in {} (no {}/latest, no step-<N>): starting fresh", k.dir, k.dir));
  }
  if (!resumed && !k.init_weights.empty()) reporter.note(fmt::format("initial weights: {}", k.init_weights));
  int64_t stage_parameters = 0;
  for (Parameter* q : stage.module().parameters()) stage_parameters += q->value.numel();
  if (zero)
    reporter.note(fmt::format("{}; the last stage's, over its {} replicas", memory_line(*optimizer, c.ddp.zero_stage, grid.replicas),
                              grid.replicas));
  reporter.note(fmt::format("pipeline: {} stage(s) x {} replica(s), {}{} micro-batch(es) of {} sequences, "
                            "schedule {}, layers {} (0: the embeddings, {}: ln_f and the head, which holds its copy of "
                            "the tied wte); this stage (the last) holds {} parameters",
                            grid.stages, grid.replicas,
                            c.accumulate > 1 ? fmt::format("{} accumulated batch(es) of ", c.accumulate) : "",
                            p.micro_batches, c.batch_size / p.micro_batches,
                            pipeline_schedule_name(p.schedule), describe_partition(ranges), lm.layers + 1,
                            stage_parameters));
  report_reached_training();
  TrainResult result;
  result.world_size = rt.size();
  result.device = rt.device().str();
  result.parameters = parameters;
  Tracer tracer(!c.output.trace_path.empty());
  const double tokens_per_step = static_cast<double>(c.batch_size * lm.context * c.accumulate * grid.replicas);
  const safetensors::Metadata architecture = gpt_architecture_metadata(spec);
  SampleLog sample_log(rt.rank());  // a test hook: the slots stage 0 of each replica reads
  // Between two steps, by every rank together (each stage's replica 0 holds its tensors).
  int64_t last_saved = resumed ? step : -1;
  const auto save = [&] {
    set_collective_context(fmt::format("checkpoint of step {}", step));
    checkpoint::TrainingState state = lm_training_state(step, slots, c, rt.size(), schedule);
    state.grad_scaler = gate.state_json();
    saver.save_stage(state, stage.module(), *optimizer, {grid.stage, grid.replica}, whole, architecture);
    reporter.note(fmt::format("checkpoint: {}", saver.last_path()));
    last_saved = step;
  };
  // Note [Agreeing to stop] (app/preemption.h), as the image pipeline's: the vote is on the world
  // (a stage that stopped alone would leave its neighbours waiting in their next transfer); every
  // stage saves its tensors at the agreed boundary and each rank exits with 128 + the signal.
  StopSignals signals;
  StopVote stop_vote(rt.control());
  int stopped_by = 0;
  const auto stop = [&](int signal) {
    stopped_by = signal;
    if (!k.dir.empty() && last_saved != step) save();
    saver.finish();  // the save is complete before any rank exits (a launcher ends the job then)
    if (rt.rank() == 0) {
      std::fflush(stdout);
      fmt::print(stderr, "dtrain: stopped by {} at step {} (slot {}); {}\n", signal_name(signal), step, slots,
                 k.dir.empty() ? "nothing saved (no --checkpoint-dir)"
                               : fmt::format("checkpoint {} saved; continue with --resume auto", saver.last_path()));
      std::fflush(stderr);
    }
    rt.control().barrier();
  };
  const int64_t first_step = step;  // a resumed run times only its own steps
  const auto start = Clock::now();
  auto interval_start = start;
  int64_t interval_steps = 0;
  double eval_seconds = 0;
  float loss = 0;
  Tensor loss_tensor = Tensor::zeros({1});  // the progress line reads the loss from a tensor
  while (step < lm.steps) {
    set_collective_context(fmt::format("step {}", step + 1));
    optimizer->zero_grad();
    // --accumulate A: A pipeline steps per optimizer step, the stage's gradient sum over its
    // replicas in the last one's last micro-batch only (Note [Pipeline loss]); the loss logged is
    // the last batch's, as the unsplit GPT logs its last micro-batch's.
    for (int64_t a = 0; a < c.accumulate; ++a) {
      const int64_t g = slots + a * grid.replicas + grid.replica;
      data.stage_train(g);
      if (sample_log.enabled() && grid.stage == 0) {  // the slot read, not the counter: they differ when shuffled
        const int64_t slot = data.train_slot(g);
        sample_log.record(0, step + 1, std::span(&slot, 1));
      }
      const Tensor targets = data.targets().view({c.batch_size, lm.context});
      loss = stage.train_step(data.inputs(), targets, {a, c.accumulate, gate.loss_scale()}).loss;
      trace_pipeline_step(tracer, stage);
    }
    if (reduce_scatter) zero->reduce_scatter_gradients();
    optimizer->set_lr(static_cast<float>(schedule.lr_at(step)));
    if (gate.pass(step + 1)) {  // fp16: unscale, check, the world's vote
      if (clipper) clipper->clip(c.clip_grad_norm);
      ScopedSpan span(&tracer, "optimizer step");
      optimizer->step();
    }
    reporter.note(gate.take_warning());
    ++step;
    slots += c.accumulate * grid.replicas;
    if (last && grid.replicas > 1) grid.data_parallel->allreduce(&loss, 1, DType::kF32, ReduceOp::kAvg);
    if (last && !std::isfinite(loss))
      // As the image pipeline's: the last stage alone sees the loss (core/exit_status.h).
      throw Error(fmt::format("the loss is {} at step {}: training diverged", loss, step), ErrorKind::kDiverged);
    ++interval_steps;
    const bool end = step == lm.steps;
    if (reporter.draws_progress()) {  // rates over this run's steps, evaluations left out
      const double run_seconds = seconds_since(start) - eval_seconds;
      const double steps_per_s = run_seconds > 0 ? static_cast<double>(step - first_step) / run_seconds : 0;
      loss_tensor.data()[0] = loss;
      reporter.lm_progress({step, lm.steps, tokens_per_step * steps_per_s, 0.f, schedule.lr_at(step - 1),
                            steps_per_s > 0 ? static_cast<double>(lm.steps - step) / steps_per_s : 0},
                           loss_tensor);
    }
    if (step % c.output.log_interval == 0 || step == 1 || end) {
      const double seconds = seconds_since(interval_start);
      reporter.lm_step({step, lm.steps, loss, clipper ? clipper->last_norm() : -1.f, schedule.lr_at(step - 1),
                        1e3 * seconds / static_cast<double>(interval_steps),
                        tokens_per_step * static_cast<double>(interval_steps) / seconds});
      interval_start = Clock::now();
      interval_steps = 0;
    }
    if (end || (lm.eval_every > 0 && step % lm.eval_every == 0)) {
      const auto t0 = Clock::now();
      set_collective_context(fmt::format("step {} evaluation", step));
      result.val_loss = pipeline_validation_loss(stage, data, std::min(lm.eval_batches, data.val_slots()));
      reporter.lm_eval(step, result.val_loss);
      eval_seconds += seconds_since(t0);
      interval_start = Clock::now();
    }
    // As the GPT's RunControl: a checkpoint when due and at the end; a stop saves where it is.
    const bool due = !k.dir.empty() && last_saved != step && (end || (k.every > 0 && step % k.every == 0));
    if (due) save();
    if (end) break;
    if (stop_vote.votes_here(due)) {
      if (const int signal = stop_vote.cast({StopSignals::received(), false}).signal; signal != 0) {
        stop(signal);
        break;
      }
    }
  }
  saver.finish();
  result.train_seconds = seconds_since(start) - eval_seconds;
  result.global_step = step;
  if (stopped_by != 0) {  // rank 0 said where and what was saved
    result.stop_signal = stopped_by;
    shutdown_pipeline(grid, clipper);
    return result;
  }
  if (step == first_step) {  // resumed at the end: nothing trained
    set_collective_context(fmt::format("step {} evaluation", step));
    result.val_loss = pipeline_validation_loss(stage, data, std::min(lm.eval_batches, data.val_slots()));
  }
  result.train_loss = loss;
  result.tokens_per_second = result.train_seconds > 0 ? tokens_per_step * static_cast<double>(step - first_step) /
                                                            result.train_seconds
                                                      : 0;
  result.parameters_fingerprint = pipeline_fingerprint(rt.control(), stage, grid.stages);
  report_pipeline_figures(reporter, rt.control(), stage, p);
  if (tracer.enabled()) {
    tracer.write(c.output.trace_path, rt.control());
    reporter.note(fmt::format("trace: wrote {} (a row per rank: stage s of replica d is rank d x P + s)",
                              c.output.trace_path));
  }
  reporter.finish_lm(result);
  shutdown_pipeline(grid, clipper);
  return result;
}

}  // namespace dtrain
