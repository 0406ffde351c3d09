#include "app/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "app/batch_stager.h"
#include "app/evaluate.h"
#include "app/reporter.h"
#include "app/trace.h"
#include "comm/mpi_lifecycle.h"
#include "core/memory.h"
#include "core/ops.h"
#include "data/data_loader.h"
#include "data/distributed_sampler.h"
#include "model/fingerprint.h"
#include "model/loss.h"

namespace dtrain {

namespace {

// The model spec with this rank's share of the machine's memory as its budget: ranks that
// share a node must all fit.
ModelSpec model_spec_for_rank(ModelSpec spec, const Runtime& runtime) {
  if (spec.memory_budget_bytes <= 0) spec.memory_budget_bytes = host_memory_bytes() / std::max(1, runtime.local_size());
  return spec;
}

// One run: everything a step needs, built once in the constructor (data, model, DDP,
// optimizer), then epochs of steps.
class Trainer {
 public:
  Trainer(Runtime& runtime, const TrainConfig& config);
  TrainResult run();

 private:
  void run_epoch(int64_t epoch, TrainResult& result);
  struct StepResult {
    Tensor loss;          // on the device
    bool stepped = false;  // this micro-batch ended its group: gradients synced, optimizer stepped
  };
  // One micro-batch: forward, loss, backward (synced or under no_sync), and the optimizer step
  // that ends its group.
  StepResult step(const Tensor& images, const Tensor& labels, int64_t batch, int64_t batches);

  Runtime& rt_;
  const TrainConfig& c_;
  MnistSplits data_;
  std::unique_ptr<Sequential> model_;
  std::optional<DistributedDataParallel> ddp_;  // none on one rank: nothing to synchronise
  std::unique_ptr<Optimizer> optimizer_;
  LrSchedule schedule_;
  DistributedSampler sampler_;
  std::unique_ptr<DataLoader> loader_;
  BatchStager stager_;
  CrossEntropyLoss loss_fn_;
  Tracer tracer_;
  Reporter reporter_;
};

Trainer::Trainer(Runtime& runtime, const TrainConfig& c)
    : rt_(runtime),
      c_(c),
      data_(load_mnist_splits(c.data.dir, c.data.normalize, c.data.train_limit, c.data.test_limit)),
      model_(build_model(model_spec_for_rank(c.model, runtime), data_.train->sample_shape(),
                         data_.train->num_classes(), runtime.device(), c.seed)),
      schedule_{c.lr_schedule, c.optimizer.lr, c.lr_step_size, c.lr_gamma, c.epochs, 0.f},
      sampler_(data_.train->size(), runtime.size(), runtime.rank(), true, c.seed),
      loader_(std::make_unique<DataLoader>(*data_.train, c.batch_size)),
      stager_(runtime.device()),
      tracer_(!c.output.trace_path.empty()),
      reporter_(c.output, runtime.rank() == 0,
                progress_wanted(c.output.progress, started_by_launcher(process_env), process_env("DTRAIN_STDOUT_IS_TTY"),
                                isatty(STDOUT_FILENO) == 1)) {
  model_->set_amp(c.amp);
  if (runtime.size() > 1) ddp_.emplace(*model_, runtime, c.ddp);
  optimizer_ = make_optimizer(c.optimizer, model_->parameters());
  reporter_.start(runtime, model_->describe(), c, data_.train->size(), data_.test->size());
}

Trainer::StepResult Trainer::step(const Tensor& images, const Tensor& labels, int64_t b, int64_t batches) {
  const int64_t micro = b % c_.accumulate;
  const bool step_now = micro == c_.accumulate - 1 || b == batches - 1;
  if (micro == 0) optimizer_->zero_grad();
  Tensor logits;
  {
    ScopedSpan span(&tracer_, "forward");
    logits = model_->forward(images);
  }
  Tensor loss = loss_fn_.forward(logits, labels);
  Tensor grad = loss_fn_.backward();
  // The step sees the mean over its micro-batches (the epoch's last group may be shorter).
  const int64_t group = std::min(c_.accumulate, batches - (b - micro));
  if (group > 1) scale(grad, 1.f / static_cast<float>(group));
  if (!ddp_) {
    ScopedSpan span(&tracer_, "backward");
    model_->backward(grad, false);
  } else if (step_now) {
    ddp_->backward(grad);
    tracer_.add_backward(ddp_->last_backward());
  } else {
    auto guard = ddp_->no_sync();
    ScopedSpan span(&tracer_, "backward (no_sync)");
    ddp_->backward(grad);
  }
  if (step_now) {
    ScopedSpan span(&tracer_, "optimizer step");
    optimizer_->step();
  }
  return {loss, step_now};
}

void Trainer::run_epoch(int64_t epoch, TrainResult& result) {
  sampler_.set_epoch(epoch);
  loader_->start_epoch(sampler_.indices());
  optimizer_->set_lr(schedule_.lr_at(epoch));
  const int64_t batches = loader_->num_batches();
  int64_t samples = 0;
  reporter_.start_epoch(epoch, batches, sampler_.total_size());
  const auto t0 = std::chrono::steady_clock::now();
  StagedBatches data(*loader_, stager_);
  for (int64_t b = 0; data.next(); ++b) {
    const int64_t batch_samples = data.labels().numel();
    const StepResult r = step(data.images(), data.labels(), b, batches);
    reporter_.after_step(epoch, b, samples * rt_.size(), batch_samples * rt_.size(), r.loss, optimizer_->lr(),
                         ddp_ && r.stepped ? &ddp_->last_backward() : nullptr);
    samples += batch_samples;
  }
  rt_.compute_stream().synchronize();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t global_samples = samples * rt_.size();  // every rank runs the same count
  result.train_samples += global_samples;
  result.train_seconds += seconds;
  const Evaluation eval = evaluate(*model_, *data_.test, rt_.control(), rt_.device());
  result.test_loss = eval.loss;
  result.test_accuracy = eval.accuracy;
  reporter_.end_epoch(epoch, eval, data_.test->size(), global_samples, seconds, rt_.size());
}

TrainResult Trainer::run() {
  TrainResult result;
  result.world_size = rt_.size();
  result.device = rt_.device().str();
  for (int64_t epoch = 0; epoch < c_.epochs; ++epoch) run_epoch(epoch, result);
  result.samples_per_second = result.train_seconds > 0 ? static_cast<double>(result.train_samples) / result.train_seconds : 0;
  result.parameters_fingerprint = parameters_fingerprint(*model_);
  if (tracer_.enabled()) {
    const Tracer::Overlap o = tracer_.write(c_.output.trace_path, rt_.control());
    result.allreduce_overlap = o.allreduce_ns > 0 ? o.overlapped_ns / o.allreduce_ns : 0.0;
    reporter_.trace_written(c_.output.trace_path, tracer_.spans().size(), result.allreduce_overlap, o.allreduce_ns);
  }
  reporter_.finish(result);
  return result;
}

}  // namespace

TrainResult train(Runtime& runtime, const TrainConfig& config) { return Trainer(runtime, config).run(); }

}  // namespace dtrain
