// The pipeline-parallel training loop (see pipeline_trainer.h).
#include "app/pipeline_trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "app/batch_stager.h"
#include "app/checkpointing.h"
#include "app/evaluate.h"
#include "app/memory_report.h"
#include "app/pipeline_report.h"
#include "app/pipeline_zero.h"
#include "app/preemption.h"
#include "app/rank_agreement.h"
#include "app/progress.h"
#include "app/reporter.h"
#include "app/trace.h"
#include "app/train_options.h"
#include "app/train_step.h"
#include "app/trainer.h"
#include "comm/exchange.h"
#include "comm/flight_recorder.h"
#include "ddp/join.h"
#include "ddp/sync_batchnorm.h"
#include "core/error.h"
#include "data/data_loader.h"
#include "data/distributed_sampler.h"
#include "app/architecture.h"
#include "core/memory.h"
#include "core/stream.h"
#include "model/fingerprint.h"
#include "model/models.h"
#include "pipeline/partition.h"
#include "train/checkpointer.h"
#include "train/root_broadcast.h"
#include "pipeline/pipeline_clip.h"
#include "pipeline/pipeline_stage.h"

namespace dtrain {

namespace {

using Clock = std::chrono::steady_clock;

// The unsplit model's tensors, named and shaped as plan_model says: what a weights file holds,
// its parameters, then its buffers (state_tensors' order; Note [Pipeline BatchNorm]: resnet18's
// running statistics travel with the stage's checkpoint like its parameters).
std::vector<safetensors::TensorSpec> whole_model_tensors(const ModelSpec& spec, const Shape& sample, int classes) {
  std::vector<safetensors::TensorSpec> out;
  const std::vector<LayerSize> plan = plan_model(spec, sample, classes);
  for (const LayerSize& l : plan)
    for (const ParameterShape& t : l.tensors) out.push_back({t.name, safetensors::Dtype::kF32, t.shape});
  for (const LayerSize& l : plan)
    for (const BufferShape& b : l.buffers) out.push_back({b.name, safetensors::from_core(b.dtype), b.shape});
  return out;
}

// The test set through the pipeline: replica d takes rows d, d + D, ...; the last stage's sums
// over the replicas.
Evaluation evaluate_pipeline(PipelineStage& stage, const Dataset& data, Device device) {
  const PipelineGrid& g = stage.grid();
  std::vector<int64_t> shard;
  for (int64_t i = g.replica; i < data.size(); i += g.replicas) shard.push_back(i);
  DataLoader loader(data, 1000);
  loader.start_epoch(std::move(shard));
  BatchStager stager(device);
  double totals[3] = {0, 0, 0};  // loss sum, correct, count
  for (StagedBatches batches(loader, stager); batches.next();) {
    const PipelineStage::Evaluated e = stage.evaluate_batch(batches.images(), batches.labels());
    totals[0] += e.loss_sum;
    totals[1] += static_cast<double>(e.correct);
    totals[2] += static_cast<double>(batches.labels().numel());
  }
  if (g.stage != g.stages - 1) return {};  // only the last stage has the loss
  // As evaluate() sums over ranks (app/evaluate.cpp), over this stage's replicas.
  float sums[3] = {static_cast<float>(totals[0]), static_cast<float>(totals[1]), static_cast<float>(totals[2])};
  g.data_parallel->allreduce(sums, 3, DType::kF32, ReduceOp::kSum);
  const float count = std::max(sums[2], 1.f);
  return {sums[0] / count, sums[1] / count, static_cast<int64_t>(sums[2])};
}

}  // namespace

PipelineGrid make_trainer_grid(Runtime& rt, const TrainConfig& c) {
  const int stages = c.pipeline.stages;
  // Also when --device auto chose the GPU (train_options refuses an explicit --device cuda).
  if (rt.device().is_cuda() && c.ddp.zero_stage > 0)
    throw Error(fmt::format("--pipeline-stages {}: not yet with {}", stages, kPipelineZeroOnGpu), ErrorKind::kUsage);
  if (std::string problem = pipeline_grid_problem(rt.size(), stages); !problem.empty())
    throw Error(fmt::format("--pipeline-stages {}: {}", stages, problem));
  if (!rt.device().is_cuda()) return make_pipeline_grid(rt.control(), stages);  // MPI carries the tensors
  return make_pipeline_grid(rt.control(), stages, [&rt](Communicator& group, const std::string& name) {
    return rt.device_communicator(group, name);
  });
}

TrainResult train_pipeline(Runtime& rt, const TrainConfig& c) {
  const PipelineSettings& p = c.pipeline;
  const DatasetSplits data = load_image_data(c.data);
  // Before the grid, whose splits P decides: ranks that disagree on P, M or the cut fail here.
  check_ranks_agree(rt.control(), shared_settings(c, data.train->size(), data.test->size()));
  PipelineGrid grid = make_trainer_grid(rt, c);
  // Note [Stage construction] (model/models.h): the cut is computed from the model's plan, and
  // this rank builds only its stage's layers, with the unsplit model's initial weights; the
  // memory check counts only them.
  const Shape sample_shape = data.train->sample_shape();
  const int classes = data.train->num_classes();
  ModelSpec spec = c.model;
  if (spec.memory_budget_bytes <= 0) spec.memory_budget_bytes = host_memory_bytes() / std::max(1, rt.local_size());
  spec.pipeline_stages = p.stages;
  const std::vector<int64_t> counts = layer_parameter_counts(spec, sample_shape, classes);
  std::vector<StageRange> ranges;
  try {
    ranges = p.split.empty() ? balanced_partition(counts, p.stages) : partition_at(p.split, counts.size(), p.stages);
  } catch (const Error& e) {
    throw Error(fmt::format("{} {}: {}", p.split.empty() ? "--pipeline-stages" : "--pipeline-split",
                            p.split.empty() ? fmt::format("{}", p.stages) : fmt::format("{}", fmt::join(p.split, ",")),
                            e.what()),
                ErrorKind::kUsage);  // as the GPT pipeline's: the same command line fails alike
  }
  const StageRange mine = ranges.at(static_cast<size_t>(grid.stage));
  // Each stage checks its own memory: one that does not fit stops every rank alike (the others
  // would wait for it in their first collective).
  std::unique_ptr<Sequential> stage_layers;
  agreed_across_ranks(rt.control(), [&] {
    stage_layers = build_model(spec, sample_shape, classes, rt.device(), c.seed, LayerRange{mine.begin, mine.end});
  });
  stage_layers->set_amp(c.amp);
  const std::vector<safetensors::TensorSpec> whole = whole_model_tensors(spec, sample_shape, classes);
  // The optimizer holds the stage's parameters (their addresses do not move with the layers).
  std::unique_ptr<Optimizer> optimizer = make_optimizer(c.optimizer, stage_layers->parameters());
  // Note [Pipeline ZeRO-1] (app/pipeline_zero.h): the optimizer state (still empty) narrows to
  // this replica's chunk before a resume asks for it.
  const bool reduce_scatter = c.ddp.zero_stage == 2 && grid.replicas > 1;
  std::optional<StageZero> zero;
  if (c.ddp.zero_stage > 0 && grid.replicas > 1) zero.emplace(*stage_layers, grid, reduce_scatter);
  // Note [Pipeline checkpoints] (train/checkpointer.h): a checkpoint of any P x D (or of a
  // data-parallel run), this stage taking its own tensors; else --init-weights, likewise; else
  // the seeded initialisation.
  const CheckpointSettings& k = c.checkpoints;
  Checkpointer saver(rt.control(), checkpointer_options(k));
  // Note [Pipeline dropout] (pipeline/pipeline_stage.h): the stage's Dropout counters are those
  // of the unsplit model's Dropout layers at its layers' places.
  const std::vector<size_t> dropouts = dropout_layer_places(spec, sample_shape, classes);
  const auto first_counter = static_cast<size_t>(
      std::count_if(dropouts.begin(), dropouts.end(), [&](size_t place) { return place < mine.begin; }));
  const std::optional<ResumedRun> resumed = restore_checkpoint(rt.control(), c, *stage_layers, *optimizer, nullptr,
                                                               StageOf(whole, first_counter, dropouts.size()));
  if (!resumed && !k.init_weights.empty())
    classify_errors(ErrorKind::kCheckpoint,
                    [&] { load_stage_weights(rt.control(), k.init_weights, *stage_layers, whole); });
  const std::string description = describe(Architecture{c.model, sample_shape, classes, c.data.normalize});
  PipelineOptions stage_options{p.schedule, p.micro_batches};
  stage_options.sum_gradients = !reduce_scatter;  // ZeRO-2 sums them itself
  stage_options.device = rt.device();
  // Note [Pipeline class weights] (pipeline/pipeline_stage.h): the global batch's weighted mean.
  stage_options.class_weights = check_class_weights(c, classes, "classes of the training data");
  // Note [Pipeline SyncBatchNorm] (pipeline/pipeline_stage.h): a micro-batch's statistics over
  // the stage's replicas (their micro-batch m together is the P x 1 run's at D times the batch).
  if (c.ddp.sync_batchnorm && grid.replicas > 1)
    convert_sync_batchnorm(*stage_layers, grid.tensor_group(), compute_stream(rt.device()));
  PipelineStage stage(std::move(stage_layers), grid, stage_options);
  // Note [Pipeline gradient norm] (pipeline/pipeline_clip.h).
  std::optional<PipelineClipper> clipper;
  if (c.clip_grad_norm > 0.f) clipper.emplace(rt.control(), stage);
  // --amp fp16 (Note [Loss scaling]): every rank of the world, all stages and replicas, adds its
  // stage's inf/NaN finding in one vote over the world, so all take or skip the same steps.
  StepGate gate(c, rt, stage.module().parameters());
  if (resumed) gate.restore(resumed->state.grad_scaler, resumed->path + "/state.json");
  const LrSchedule schedule{c.lr_schedule, c.optimizer.lr, c.lr_step_size, c.lr_gamma, c.epochs, 0.f};
  const bool last = grid.stage == grid.stages - 1;
  const bool logger = last && grid.replica == 0;
  // The progress line as the data-parallel trainer draws it, by the rank that logs.
  Reporter reporter(c.output, logger, logger && progress_wanted_here(c.output.progress));
  reporter.watch_loss_scale(gate.state());
  reporter.start(rt, description, c, data.train->size(), data.test->size());
  int64_t stage_parameters = 0;
  for (Parameter* q : stage.module().parameters()) stage_parameters += q->value.numel();
  RunPosition pos;
  if (resumed) {
    const checkpoint::TrainingState& st = resumed->state;
    pos = position_of(st, data.train->size(), resumed->path + "/state.json");
    reporter.note(fmt::format("resume: from {} (global step {}; epoch {}, {} step(s) and {} samples into it){}",
                              resumed->path, st.global_step, st.epoch + 1, st.step_in_epoch, st.sample_in_epoch,
                              k.init_weights.empty() ? "" : "; --init-weights not used"));
    if (std::string note = image_resume_layout_note(st, rt.size(), p.stages); !note.empty()) reporter.note(note);
  } else if (!k.init_weights.empty()) {
    reporter.note(fmt::format("initial weights: {}", k.init_weights));
  }
  if (zero)
    reporter.note(fmt::format("{}; the last stage's, over its {} replicas",
                              memory_line(*optimizer, c.ddp.zero_stage, grid.replicas),
                              grid.replicas));
  reporter.note(fmt::format("pipeline: {} stage(s) x {} replica(s), {} micro-batch(es) of {} rows, schedule {}, "
                            "layers {}; this stage (the last) holds {} parameters",
                            grid.stages, grid.replicas, p.micro_batches, c.batch_size / p.micro_batches,
                            pipeline_schedule_name(p.schedule), describe_partition(ranges), stage_parameters));
  // Every replica's stages read the same samples (stage 0 the images, the last the labels); the
  // batches are all full (drop_last), since each is cut into equal micro-batches.
  DistributedSampler sampler(data.train->size(), grid.replicas, grid.replica, c.data.shuffle, c.seed, c.data.sampler);
  DataLoader loader(*data.train, c.batch_size, /*drop_last=*/true);
  BatchStager stager(rt.device());
  TrainResult result;
  result.world_size = rt.size();
  result.device = rt.device().str();
  Tensor loss_tensor = Tensor::zeros({1});
  // --trace: each rank (stage s of replica d is world rank d * P + s) its own rows: forwards and
  // backwards on thread 0, its transfer batches' waits on thread 1, so the bubble shows.
  Tracer tracer(!c.output.trace_path.empty());
  const int64_t global_batch = c.batch_size * grid.replicas;
  const safetensors::Metadata architecture =
      architecture_metadata({c.model, sample_shape, classes, c.data.normalize});
  // Between two steps: where the run stands, saved by every rank together (each stage's
  // replica 0 holds its tensors).
  int64_t last_saved = resumed ? pos.global_step : -1;
  const auto save = [&] {
    if (k.dir.empty()) return;
    set_collective_context(fmt::format("checkpoint of step {}", pos.global_step));
    checkpoint::TrainingState state = position_state(pos, c, rt.size(), schedule.lr_at(pos.epoch));
    state.grad_scaler = gate.state_json();
    saver.save_stage(state, stage.module(), *optimizer, {grid.stage, grid.replica}, whole, architecture);
    reporter.note(fmt::format("checkpoint: saved {}", saver.last_path()));
    last_saved = pos.global_step;
  };
  // Note [Agreeing to stop] (app/preemption.h): SIGTERM or SIGINT stops every rank of the grid at
  // the same step boundary, where the checkpoint is saved (every stage its tensors), and each
  // exits with 128 + the signal's number. The vote is on the world: a stage that stopped alone
  // would leave its neighbours waiting in their next transfer.
  StopSignals signals;
  StopVote stop_vote(rt.control());
  int stopped_by = 0;
  const auto stop = [&](int signal) {
    stopped_by = signal;
    // --sampler uneven saves at epoch ends only: a position inside an uneven epoch has no single
    // sample to resume from (app/train_options.cpp).
    const bool can_save = c.data.sampler != SamplerTail::kUneven;
    if (can_save && last_saved != pos.global_step) save();
    saver.finish();  // the save is complete before any rank exits (a launcher ends the job then)
    if (rt.rank() == 0) {
      std::fflush(stdout);
      fmt::print(stderr, "dtrain: stopped by {} at step {} (epoch {}, {} samples into it); {}\n", signal_name(signal),
                 pos.global_step, pos.epoch + 1, pos.sample_in_epoch,
                 k.dir.empty() ? "nothing saved (no --checkpoint-dir)"
                 : !can_save   ? "no checkpoint of this step (--sampler uneven saves at epoch ends)"
                               : fmt::format("checkpoint {} saved; continue with --resume auto", saver.last_path()));
      std::fflush(stderr);
    }
    rt.control().barrier();
  };
  // A vote at a step boundary (Note [Agreeing to stop]): true when the ranks stopped there.
  const auto stop_at_boundary = [&](bool due) {
    if (!stop_vote.votes_here(due)) return false;
    const int signal = stop_vote.cast({StopSignals::received(), false}).signal;
    if (signal != 0) stop(signal);
    return signal != 0;
  };
  // Note [Pipeline Join] (pipeline/pipeline_stage.h): --sampler uneven, replicas that run out of
  // full batches before the others run joined steps on zeros.
  std::optional<Join> join;
  if (c.data.sampler == SamplerTail::kUneven && grid.replicas > 1) join.emplace(rt.control());
  Tensor joined_input, joined_labels;
  for (int64_t epoch = pos.epoch; epoch < c.epochs; ++epoch) {
    sampler.set_epoch(epoch);
    // The rest of the epoch: all of it, or what a checkpoint had not used yet.
    loader.start_epoch(sampler.indices_from(pos.sample_in_epoch));
    optimizer->set_lr(schedule.lr_at(epoch));
    const int64_t batches = loader.num_batches();
    const int64_t first = pos.sample_in_epoch / global_batch;  // numbered as an uninterrupted run's
    reporter.start_epoch(epoch, first + batches, sampler.total_size());
    const auto t0 = Clock::now();
    int64_t i = 0;
    for (StagedBatches b(loader, stager);; ++i) {
      const bool have = b.next();
      if (join) {
        // Note [Pipeline Join]: every rank votes; the boundary after the previous step comes only
        // now that all know the epoch goes on (the last one follows its evaluation).
        if (!join->any_rank_has_data(have)) break;
        if (i > 0 && stop_at_boundary(false)) break;
      } else if (!have) {
        break;
      }
      // --accumulate A: A pipeline steps per optimizer step (Note [Pipeline loss]); a joined
      // step is one (--sampler uneven takes --accumulate 1).
      const MicroBatch micro = have ? micro_batch(i, batches, c.accumulate) : MicroBatch{};
      set_collective_context(fmt::format("epoch {} step {}{}", epoch + 1, pos.global_step + 1, have ? "" : " (joined)"));
      if (micro.index_in_step == 0) optimizer->zero_grad();
      if (!have && !joined_input.defined()) {  // zeros of a batch's shape (stage 0 and the last read them)
        Shape shape = sample_shape;
        shape.insert(shape.begin(), c.batch_size);
        joined_input = Tensor::zeros(shape, rt.device());
        joined_labels = Tensor::zeros({c.batch_size}, rt.device(), DType::kI32);
      }
      float loss = stage
                       .train_step(have ? b.images() : joined_input, have ? b.labels() : joined_labels,
                                   {micro.index_in_step, micro.step_size, gate.loss_scale(), !have})
                       .loss;
      trace_pipeline_step(tracer, stage);
      if (micro.ends_step && reduce_scatter) zero->reduce_scatter_gradients();
      // After the stage's gradient sums, as the data-parallel loop's optimizer_step: the fp16
      // gate (unscale, the world's vote), then clipping over the stages and the step.
      if (micro.ends_step && gate.pass(pos.global_step + 1)) {
        if (clipper) clipper->clip(c.clip_grad_norm);
        ScopedSpan span(&tracer, "optimizer step");
        optimizer->step();
      }
      if (micro.ends_step) reporter.note(gate.take_warning());
      if (last && join) {
        // The mean over the replicas that had a batch (replica 0 always has one). With class
        // weights each replica's loss is already its share of the global weighted mean times D
        // (PipelineStage::train_step), a joined one's share 0: their sum over D.
        float sums[2] = {have ? loss : 0.f, have ? 1.f : 0.f};
        grid.data_parallel->allreduce(sums, 2, DType::kF32, ReduceOp::kSum);
        loss = c.class_weights.empty() ? sums[0] / sums[1] : sums[0] / static_cast<float>(grid.replicas);
      } else if (last && grid.replicas > 1) {
        grid.data_parallel->allreduce(&loss, 1, DType::kF32, ReduceOp::kAvg);
      }
      loss_tensor.data()[0] = loss;
      if (last && !std::isfinite(loss))
        // The last stage alone sees the loss: its error takes the job down with the diverged
        // status, as the data-parallel trainer's vote ends it (core/exit_status.h).
        throw Error(fmt::format("the loss is {} at step {}: training diverged", loss, pos.global_step + 1),
                    ErrorKind::kDiverged);
      reporter.after_step(epoch, first + i, pos.sample_in_epoch, global_batch, loss_tensor, optimizer->lr(), nullptr);
      pos.sample_in_epoch += global_batch;
      pos.samples_seen += global_batch;
      if (!micro.ends_step) continue;
      ++pos.global_step;
      ++pos.step_in_epoch;
      // The epoch's last step is saved after its evaluation, as the next epoch's start; a stop
      // there waits for the next epoch's first boundary (or the run's end, which ends it anyway).
      if (join || i + 1 == batches) continue;  // Join: the boundary comes after the next vote
      const bool due = k.every > 0 && pos.global_step % k.every == 0;
      if (due) save();
      if (stop_at_boundary(due)) break;
    }
    if (stopped_by != 0) break;
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    int64_t samples = i * global_batch;
    if (join) {  // each replica its own full batches (Note [Pipeline Join])
      samples = batches * c.batch_size;
      grid.data_parallel->allreduce(&samples, 1, DType::kI64, ReduceOp::kSum);
    }
    result.train_samples += samples;
    result.train_seconds += seconds;
    set_collective_context(fmt::format("epoch {} evaluation", epoch + 1));
    const Evaluation eval = evaluate_pipeline(stage, *data.test, rt.device());
    result.test_loss = eval.loss;
    result.test_accuracy = eval.accuracy;
    reporter.end_epoch(epoch, eval, data.test->size(), samples, seconds, rt.size());
    pos = {epoch + 1, 0, 0, pos.global_step, pos.samples_seen};
    // Every epoch end, or when --checkpoint-every is due; the run's end always.
    if (k.every == 0 || pos.global_step % k.every == 0 || pos.epoch == c.epochs) save();
  }
  saver.finish();
  result.global_step = pos.global_step;
  if (stopped_by != 0) {  // rank 0 said where and what was saved
    result.stop_signal = stopped_by;
    shutdown_pipeline(grid, clipper);
    return result;
  }
  result.samples_per_second = result.train_seconds > 0 ? static_cast<double>(result.train_samples) / result.train_seconds : 0;
  result.parameters_fingerprint = pipeline_fingerprint(rt.control(), stage, grid.stages);
  report_pipeline_figures(reporter, rt.control(), stage, p);
  if (tracer.enabled()) {
    tracer.write(c.output.trace_path, rt.control());
    reporter.note(fmt::format("trace: wrote {} (a row per rank: stage s of replica d is rank d x P + s; its forwards "
                              "and backwards, and on a second track its transfers' waits)",
                              c.output.trace_path));
  }
  reporter.finish(result);
  shutdown_pipeline(grid, clipper);
  return result;
}

}  // namespace dtrain
