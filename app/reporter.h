// Reporter: what rank 0 tells the user while training: the seeds' log lines (`Train Epoch: 1
// [6400/60000 (11%)] Loss: 2.292416`, the `Test set:` line, samples/s), and the final JSON
// summary. Other ranks report nothing (the local rank 0 of each node names its device).
#pragma once

#include <cstdint>
#include <string>

#include "app/evaluate.h"
#include "app/train_config.h"
#include "comm/runtime.h"
#include "ddp/distributed_data_parallel.h"

namespace dtrain {

class Reporter {
 public:
  Reporter(const OutputSettings& output, bool rank_zero);

  void start(Runtime& runtime, const std::string& model, const TrainConfig& config, int64_t train_size,
             int64_t test_size);
  void start_epoch(int64_t epoch, int64_t batches);
  // After batch `batch` of `epoch` (from 0): `samples_before` global samples came before it;
  // `timing` is DDP's record of the last synced backward (nullptr on one rank).
  void after_step(int64_t epoch, int64_t batch, int64_t samples_before, const Tensor& loss, float lr,
                  const BackwardTiming* timing);
  void end_epoch(int64_t epoch, const Evaluation& eval, int64_t test_size, int64_t samples, double seconds,
                 int world_size);
  // A line of its own (checkpoints, resuming), on rank 0 unless quiet; nothing for "".
  void note(const std::string& line);
  void trace_written(const std::string& path, size_t spans, double overlap, double allreduce_ns);
  void finish(const TrainResult& result);

 private:
  bool logs() const { return rank_zero_ && !output_.quiet; }

  OutputSettings output_;
  bool rank_zero_;
  int64_t batches_ = 0;
  int64_t dataset_size_ = 0;
  std::string summary_model_, summary_hidden_, summary_hook_;
  int64_t summary_batch_ = 0, summary_epochs_ = 0;
};

}  // namespace dtrain
