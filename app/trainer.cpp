#include "app/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <span>

#include <fmt/format.h>

#include "app/architecture.h"
#include "app/batch_stager.h"
#include "app/memory_report.h"
#include "app/checkpointing.h"
#include "app/divergence.h"
#include "app/evaluate.h"
#include "app/files.h"
#include "app/lm_trainer.h"
#include "app/lm_pipeline_trainer.h"
#include "app/pipeline_trainer.h"
#include "app/preemption.h"
#include "app/rank_agreement.h"
#include "app/run_control.h"
#include "app/train_options.h"
#include "app/train_step.h"
#include "app/reporter.h"
#include "app/sample_log.h"
#include "app/trace.h"
#include "checkpoint/finite.h"
#include "comm/exchange.h"
#include "comm/flight_recorder.h"
#include "comm/launch_channel.h"
#include "comm/mpi_lifecycle.h"
#include "core/memory.h"
#include "core/ops.h"
#include "data/data_loader.h"
#include "data/distributed_sampler.h"
#include "data/npy_dataset.h"
#include "ddp/join.h"
#include "model/fingerprint.h"
#include "model/grad_clip.h"
#include "model/loss.h"
#include "train/root_broadcast.h"

namespace dtrain {

namespace {

// The model spec with this rank's share of the machine's memory as its budget: ranks that
// share a node must all fit.
ModelSpec model_spec_for_rank(ModelSpec spec, const Runtime& runtime, int zero_stage) {
  if (spec.memory_budget_bytes <= 0) spec.memory_budget_bytes = host_memory_bytes() / std::max(1, runtime.local_size());
  spec.ranks = runtime.size();
  spec.zero_stage = zero_stage;
  return spec;
}

using Clock = std::chrono::steady_clock;

// One run: everything a step needs, built once in the constructor (data, model, DDP, optimizer,
// and where training starts: a checkpoint, given weights or the seeded initialisation), then
// epochs of steps with checkpoints and the stop vote at the boundaries between steps.
class Trainer {
 public:
  Trainer(Runtime& runtime, const TrainConfig& config);
  TrainResult run();

 private:
  void choose_starting_point();
  // Trains the rest of epoch pos_.epoch; false when the ranks agreed to stop.
  bool run_epoch(TrainResult& result);
  Tensor step(const Tensor& images, const Tensor& labels, const MicroBatch& micro);
  void join_step();
  void optimizer_step();
  // Between two optimizer steps (`epoch_end`: after an epoch's evaluation): RunControl votes,
  // saves a checkpoint when one is due; false when the ranks agreed to stop.
  bool at_step_boundary(bool epoch_end);
  checkpoint::TrainingState training_state() const;

  Runtime& rt_;
  const TrainConfig& c_;
  DatasetSplits data_;
  std::unique_ptr<Sequential> model_;
  std::optional<DistributedDataParallel> ddp_;  // none on one rank: nothing to synchronise
  std::optional<Join> join_;                     // --sampler uneven on more than one rank
  std::unique_ptr<Optimizer> optimizer_;
  std::optional<GradNormClipper> clipper_;  // --clip-grad-norm
  std::optional<StepGate> gate_;  // --amp fp16's loss scaling
  LrSchedule schedule_;
  DistributedSampler sampler_;
  std::unique_ptr<DataLoader> loader_;
  BatchStager stager_;
  CrossEntropyLoss loss_fn_;
  Tracer tracer_;
  Reporter reporter_;
  RunPosition pos_;
  SampleLog sample_log_;
  std::optional<RunControl> control_;  // built once the model and optimizer exist
};

Trainer::Trainer(Runtime& runtime, const TrainConfig& c)
    : rt_(runtime),
      c_(c),
      data_(classify_errors(ErrorKind::kData, [&] {
        return load_image_data(c.data);
      })),
      model_(build_model(model_spec_for_rank(c.model, runtime, c.ddp.zero_stage), data_.train->sample_shape(),
                         data_.train->num_classes(), runtime.device(), c.seed)),
      schedule_{c.lr_schedule, c.optimizer.lr, c.lr_step_size, c.lr_gamma, c.epochs, 0.f},
      sampler_(data_.train->size(), runtime.size(), runtime.rank(), c.data.shuffle, c.seed, c.data.sampler),
      loader_(std::make_unique<DataLoader>(*data_.train, c.batch_size)),
      stager_(runtime.device()),
      tracer_(!c.output.trace_path.empty()),
      reporter_(c.output, runtime.rank() == 0, progress_wanted_here(c.output.progress)),
      sample_log_(runtime.rank()) {
  // Before the first collective whose count or shape a setting decides (DDP's checks, the
  // broadcast, the steps): ranks started with other flags fail here, in one line, not in a hang.
  check_ranks_agree(runtime.control(), shared_settings(c, data_.train->size(), data_.test->size()));
  loss_fn_ = CrossEntropyLoss(Reduction::kMean,
                              check_class_weights(c, data_.train->num_classes(), "classes of the training data"));
  model_->set_amp(c.amp);
  if (runtime.size() > 1) {
    DdpOptions ddp = c.ddp;
    ddp.device_timing = c.runtime.device_timing;  // --trace or --metrics (app/train_options.cpp)
    ddp_.emplace(*model_, runtime, ddp);
  }
  if (runtime.size() > 1 && c.data.sampler == SamplerTail::kUneven) join_.emplace(runtime.control());
  optimizer_ = make_optimizer(c.optimizer, model_->parameters());
  if (c.clip_grad_norm > 0.f) clipper_.emplace(model_->parameters(), host_sum_over_ranks(runtime.control()));
  gate_.emplace(c, runtime, model_->parameters());
  reporter_.watch_loss_scale(gate_->state());
  control_.emplace(
      runtime, c, *model_, *optimizer_, reporter_,
      architecture_metadata({c.model, data_.train->sample_shape(), data_.train->num_classes(), c.data.normalize}),
      RunControl::Callbacks{
          [this] { return training_state(); },
          [this] {
            return fmt::format("step {} (epoch {}, {} samples into it)", pos_.global_step, pos_.epoch + 1,
                               pos_.sample_in_epoch);
          },
          "no checkpoint of this step (--sampler uneven saves at epoch ends)"});
  choose_starting_point();
}

// A checkpoint (--resume), else given weights (--init-weights), else the seeded initialisation.
// Everything that can fail is read before anything is printed: a checkpoint that does not fit
// is the run's only line.
void Trainer::choose_starting_point() {
  const CheckpointSettings& k = c_.checkpoints;
  const std::optional<ResumedRun> resumed = control_->read_starting_point(*optimizer_, ddp_ ? &*ddp_ : nullptr);
  reporter_.start(rt_, model_->describe(), c_, data_.train->size(), data_.test->size());
  reporter_.note(memory_line(*optimizer_, ddp_ ? c_.ddp.zero_stage : 0, rt_.size()));
  control_->announce_start(resumed, ddp_ ? &*ddp_ : nullptr);
  if (!resumed) return;
  const checkpoint::TrainingState& s = resumed->state;
  gate_->restore(s.grad_scaler, resumed->path + "/state.json");
  pos_ = position_of(s, data_.train->size(), resumed->path + "/state.json");
  reporter_.note(fmt::format("resume: from {} (global step {}; epoch {}, {} step(s) and {} samples into it){}",
                             resumed->path, s.global_step, s.epoch + 1, s.step_in_epoch, s.sample_in_epoch,
                             k.init_weights.empty() ? "" : "; --init-weights not used"));
  // Note [Resume layout]: a pipeline's checkpoint at this world size is another layout too.
  if (std::string note = image_resume_layout_note(s, rt_.size(), c_.pipeline.stages); !note.empty())
    reporter_.note(note);
  if (pos_.epoch >= c_.epochs)
    reporter_.note(fmt::format("resume: the checkpoint has finished epoch {} of --epochs {}: nothing left to train",
                               pos_.epoch, c_.epochs));
}

Tensor Trainer::step(const Tensor& images, const Tensor& labels, const MicroBatch& micro) {
  if (micro.index_in_step == 0) optimizer_->zero_grad();
  Tensor loss = forward_backward(*model_, ddp_ ? &*ddp_ : nullptr, loss_fn_, tracer_, images, labels,
                                 {micro.step_size, micro.ends_step, gate_->loss_scale()});
  if (micro.ends_step) optimizer_step();
  if (ddp_)
    for (const std::string& note : ddp_->take_bucket_notes()) reporter_.note(note);
  return loss;
}

bool Trainer::run_epoch(TrainResult& result) {
  const int64_t epoch = pos_.epoch;
  sampler_.set_epoch(epoch);
  // The rest of the epoch: all of it, or what a checkpoint had not used yet.
  const int64_t epoch_start_position = pos_.sample_in_epoch;
  const std::vector<int64_t> indices = sampler_.indices_from(pos_.sample_in_epoch);
  loader_->start_epoch(indices);
  optimizer_->set_lr(schedule_.lr_at(epoch));
  const int64_t batches = loader_->num_batches();
  const int64_t world = rt_.size();
  // Batches are numbered (in the log) from the epoch's start, as an uninterrupted run at this
  // world size numbers them.
  const int64_t first = pos_.sample_in_epoch / (c_.batch_size * world);
  reporter_.start_epoch(epoch, first + batches, sampler_.total_size());
  int64_t samples = 0;
  const auto t0 = Clock::now();
  StagedBatches data(*loader_, stager_);
  for (int64_t i = 0;; ++i) {
    const bool have = data.next();
    if (join_) {
      // Uneven inputs: every rank votes at each step; the boundary after the previous step comes
      // only now that all know the epoch goes on (the last one follows its evaluation).
      if (!join_->any_rank_has_data(have)) break;
      ddp_->set_buffer_source(join_->highest_rank_with_data());  // Note [Buffer broadcast]
      if (i > 0 && !at_step_boundary(false)) return false;
      if (!have) {
        set_collective_context(fmt::format("epoch {} step {} (joined)", epoch + 1, pos_.global_step + 1));
        join_step();
        continue;
      }
    } else if (!have) {
      break;
    }
    const MicroBatch micro = micro_batch(i, batches, c_.accumulate);
    // What the collectives of this step are for, in the flight recorder and timeout lines.
    set_collective_context(fmt::format("epoch {} step {}", epoch + 1, pos_.global_step + 1));
    if (micro.index_in_step == 0) control_->begin_step();
    Tensor loss = step(data.images(), data.labels(), micro);
    control_->record_loss(loss, {pos_.global_step + 1, epoch, first + i + 1});
    const int64_t n = data.labels().numel();
    if (sample_log_.enabled())
      sample_log_.record(epoch, pos_.global_step + 1, std::span(indices).subspan(static_cast<size_t>(i * c_.batch_size), static_cast<size_t>(n)));
    reporter_.after_step(epoch, first + i, pos_.sample_in_epoch, n * world, loss, optimizer_->lr(),
                         ddp_ && micro.ends_step ? &ddp_->last_backward() : nullptr);
    samples += n;
    pos_.sample_in_epoch += n * world;
    pos_.samples_seen += n * world;
    if (!micro.ends_step) continue;
    ++pos_.global_step;
    ++pos_.step_in_epoch;
    control_->end_step({pos_.global_step, epoch, first + i + 1});
    if (!join_ && i + 1 < batches) {  // the epoch's last step ends at the boundary after its evaluation
      if (!at_step_boundary(false)) return false;
    }
  }
  rt_.compute_stream().synchronize();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  // Every rank runs the same count, except with uneven inputs: then the epoch's rest, once.
  const int64_t global_samples = join_ ? sampler_.total_size() - epoch_start_position : samples * world;
  result.train_samples += global_samples;
  result.train_seconds += seconds;
  set_collective_context(fmt::format("epoch {} evaluation", epoch + 1));
  const Evaluation eval = evaluate(*model_, *data_.test, rt_.control(), rt_.device());
  result.test_loss = eval.loss;
  result.test_accuracy = eval.accuracy;
  reporter_.end_epoch(epoch, eval, data_.test->size(), global_samples, seconds, world);
  pos_.epoch = epoch + 1;
  pos_.step_in_epoch = 0;
  pos_.sample_in_epoch = 0;
  return at_step_boundary(true);
}

// A rank out of data while others still train (--sampler uneven): the same collectives and the
// same optimizer step as theirs, with zero gradients of its own (Join).
void Trainer::join_step() {
  optimizer_->zero_grad();
  ddp_->join_forward();
  ddp_->join_backward();
  // The others unscale and clip the all-reduced gradient before their step, and vote on skipping
  // it: so must this rank, or its parameters drift from theirs (or it misses their vote).
  optimizer_step();
  for (const std::string& note : ddp_->take_bucket_notes()) reporter_.note(note);
  ++pos_.global_step;
  ++pos_.step_in_epoch;
}

// After the gradient all-reduce of step pos_.global_step + 1: the fp16 gate (unscale, check,
// the ranks' vote), then clipping and the optimizer step unless the gate skips it.
void Trainer::optimizer_step() {
  const bool take = gate_->pass(pos_.global_step + 1);
  reporter_.note(gate_->take_warning());
  if (!take) return;
  if (clipper_) clipper_->clip(c_.clip_grad_norm);  // after the all-reduce: the same on every rank
  ScopedSpan span(&tracer_, "optimizer step");
  optimizer_->step();
}

bool Trainer::at_step_boundary(bool epoch_end) {
  const CheckpointSettings& k = c_.checkpoints;
  // Uneven epochs have no single position to resume from: they save at epoch ends only.
  return control_->at_step_boundary({.global_step = pos_.global_step,
                                     .run_end = epoch_end && pos_.epoch >= c_.epochs,
                                     .due = k.every > 0 ? pos_.global_step % k.every == 0 : epoch_end,
                                     .can_save = !(join_ && !epoch_end)});
}

checkpoint::TrainingState Trainer::training_state() const {
  checkpoint::TrainingState s = position_state(pos_, c_, rt_.size(), schedule_.lr_at(pos_.epoch));
  if (ddp_ && ddp_->bucket_layout_final()) s.buckets = bucket_layout_json(ddp_->bucket_layout());
  s.grad_scaler = gate_->state_json();
  return s;  // the saver adds the Dropout counters
}

TrainResult Trainer::run() {
  TrainResult result;
  result.world_size = rt_.size();
  result.device = rt_.device().str();
  while (pos_.epoch < c_.epochs) {
    if (!run_epoch(result)) break;
  }
  result.stop_signal = control_->stopped_by();
  result.diverged = control_->diverged();
  control_->finish();  // a failed background save fails the run here
  result.global_step = pos_.global_step;
  if (result.stop_signal || result.diverged) return result;
  result.samples_per_second = result.train_seconds > 0 ? static_cast<double>(result.train_samples) / result.train_seconds : 0;
  result.parameters_fingerprint = parameters_fingerprint(*model_);
  control_->write_trace(tracer_, result);
  reporter_.finish(result);
  return result;
}

// Every output path is checked writable before data is loaded or a step is taken, so a run that
// could not save fails in its first second, not after training: rank 0's (checkpoints, trace)
// by rank 0, alike on every rank; each rank's own flight recorder directory by that rank.
void check_output_paths(Runtime& runtime, const TrainConfig& c) {
  broadcast_from_root(runtime.control(), [&]() -> std::vector<std::string> {
    if (!c.checkpoints.dir.empty()) check_writable_dir("--checkpoint-dir", c.checkpoints.dir, true);
    if (!c.output.trace_path.empty()) check_writable_file("--trace", c.output.trace_path);
    return {};
  });
  // The default, the working directory, is left alone: a run started in a read-only folder
  // should not fail for a dump it may never write (and the dump names its own failure).
  const std::string& recorder_dir = c.runtime.flight_recorder_dir;
  if (c.runtime.flight_recorder_size <= 0 || recorder_dir.empty() || recorder_dir == ".") return;
  // Each rank checks its own (nodes need not share it), and all learn every rank's verdict, so
  // that one rank's problem is one line and every rank stops alike, with no MPI_Abort.
  std::string mine;
  try {
    check_writable_dir("--flight-recorder-dir", recorder_dir, false);
  } catch (const Error& e) {
    mine = e.what();
  }
  const std::vector<std::string> verdicts = allgather_strings(runtime.control(), mine);
  for (size_t r = 0; r < verdicts.size(); ++r)
    if (!verdicts[r].empty())
      throw AgreedError(runtime.size() > 1 ? fmt::format("rank {}: {}", r, verdicts[r]) : verdicts[r],
                        ErrorKind::kOutput);
}

}  // namespace

DatasetSplits load_image_data(const DataSettings& d) {
  if (d.format == DataFormat::kNpy) return load_npy_splits(d.dir, d.normalize, d.train_limit, d.test_limit, d.classes);
  MnistSplits m = load_mnist_splits(d.dir, d.normalize, d.train_limit, d.test_limit, d.classes);
  return {std::move(m.train), std::move(m.test)};
}

TrainResult train(Runtime& runtime, const TrainConfig& config) {
  check_output_paths(runtime, config);
  if (config.lm)
    return config.pipeline.stages > 1 ? train_language_model_pipeline(runtime, config)
                                      : train_language_model(runtime, config);
  if (config.pipeline.stages > 1) return train_pipeline(runtime, config);
  Trainer trainer(runtime, config);
  report_reached_training();  // Note [Reaching training]
  return trainer.run();
}

}  // namespace dtrain
