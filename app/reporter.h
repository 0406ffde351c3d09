// Reporter: what rank 0 tells the user while training. On a terminal a progress line redrawn in
// place (app/progress.h); otherwise the seeds' log lines (`Train Epoch: 1 [6400/60000 (11%)]
// Loss: 2.292416`); in both, the `Test set:` and samples/s lines after each epoch, the final JSON
// summary (--json), and with --metrics a JSON-lines file: one record per log interval and one
// per epoch. Other ranks report nothing (the local rank 0 of each node names its device). The
// lines go out through a LogOutput, so a reader who stops reading cannot hold up a stop.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "app/evaluate.h"
#include "app/log_output.h"
#include "app/progress.h"
#include "app/train_config.h"
#include "comm/runtime.h"
#include "ddp/distributed_data_parallel.h"
#include "model/grad_scaler.h"

namespace dtrain {

// What one log interval's steps spent around the gradient all-reduce (from DDP's timings).
struct AllreduceStats {
  double wait_s = 0;        // backward finished, waiting for the last all-reduces
  double allreduce_s = 0;   // all-reduce time on the communication side
  double overlapped_s = 0;  // the part of it that ran while backward was still running
  void add(const BackwardTiming& t);
};

class Reporter {
 public:
  // `progress`: draw the progress line instead of the seeds' step lines (rank 0 only).
  Reporter(const OutputSettings& output, bool rank_zero, bool progress);
  ~Reporter();

  void start(Runtime& runtime, const std::string& model, const TrainConfig& config, int64_t train_size,
             int64_t test_size);
  void start_epoch(int64_t epoch, int64_t batches, int64_t samples_in_epoch);
  // After batch `batch` of `epoch` (from 0): `samples_before` global samples of the epoch came
  // before it, `batch_samples` global samples were in it; `timing` is DDP's record of the last
  // synced backward (nullptr on one rank or under no_sync).
  void after_step(int64_t epoch, int64_t batch, int64_t samples_before, int64_t batch_samples, const Tensor& loss,
                  float lr, const BackwardTiming* timing);
  void end_epoch(int64_t epoch, const Evaluation& eval, int64_t test_size, int64_t samples, double seconds,
                 int world_size);
  // --model gpt (app/lm_trainer.h): the opening line; a log line every --log-interval steps,
  // llm.c's ("step 10/500 | loss 2.3456 | norm 0.53 | lr 1.00e-03 | 412 ms | 4,114 tokens/s");
  // the validation loss ("val loss 2.1034"); each also a metrics record (--metrics); the final
  // JSON line (--json).
  void start_lm(Runtime& runtime, const std::string& model, const TrainConfig& config, int64_t train_tokens,
                int64_t val_tokens, int64_t parameters);
  struct LmStep {
    int64_t step = 0;  // optimizer steps done, this one included
    int64_t steps = 0;
    float loss = 0;
    float norm = -1;  // the global gradient norm (< 0: not measured)
    double lr = 0;
    double step_ms = 0;  // this interval's mean step time
    double tokens_per_s = 0;
  };
  // The per-step log line, unless the progress line is drawn; the metrics record always.
  void lm_step(const LmStep& s);
  // After every optimizer step: redraws the progress line when it is due (the last step always);
  // `loss` is read from the device only then. Nothing without the progress line.
  void lm_progress(const LmProgressState& state, const Tensor& loss);
  bool draws_progress() const { return progress_ != nullptr; }
  void lm_eval(int64_t step, double val_loss);
  void finish_lm(const TrainResult& result);
  // --amp fp16: the loss scale's state (kept by the loop's StepGate), shown in the log lines and
  // the metrics records (scale, skipped steps); null: none.
  void watch_loss_scale(const GradScalerState* state) { loss_scale_ = state; }
  // A line of its own (checkpoints, resuming), on rank 0 unless quiet; nothing for "".
  void note(const std::string& line);
  // One more metrics record (--metrics), as given, with the run's "time_s" added; nothing
  // without --metrics.
  void metrics_record(nlohmann::json record);
  void trace_written(const std::string& path, size_t spans, double overlap, double allreduce_ns);
  void finish(const TrainResult& result);

 private:
  using Clock = std::chrono::steady_clock;
  bool logs() const { return rank_zero_ && !output_.quiet; }
  void write_step_record(int64_t epoch, int64_t batch, int64_t samples, float loss, float lr);
  void add_loss_scale(nlohmann::json& record) const;
  void amp_line(Runtime& runtime, const TrainConfig& config);  // --amp's opening line

  void print(std::string_view text) { out_.write(text); }

  OutputSettings output_;
  bool rank_zero_;
  LogOutput out_;
  std::unique_ptr<ProgressLine> progress_;
  std::FILE* metrics_ = nullptr;
  int64_t epochs_ = 1, batches_ = 0, dataset_size_ = 0, samples_in_epoch_ = 0;
  int64_t global_step_ = 0, samples_run_ = 0;  // over the whole run
  Clock::time_point run_start_, epoch_start_, interval_start_;
  int64_t interval_samples_ = 0;
  AllreduceStats interval_;
  std::string summary_model_, summary_hidden_, summary_hook_;
  int64_t summary_batch_ = 0;
  const GradScalerState* loss_scale_ = nullptr;
};

}  // namespace dtrain
