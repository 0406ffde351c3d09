// TrainConfig: every setting of a `dtrain train` run, typed, as the library layers take them
// (RuntimeOptions, ModelSpec, OptimizerSpec, DdpOptions, ...). The command line is parsed into
// it once, and validated there (app/train_options.h); nothing downstream re-checks a flag.
#pragma once

#include <cstdint>
#include <string>

#include "comm/runtime.h"
#include "data/mnist.h"
#include "ddp/distributed_data_parallel.h"
#include "model/amp.h"
#include "model/lr_schedule.h"
#include "model/models.h"
#include "model/optimizer.h"

namespace dtrain {

struct DataSettings {
  std::string dir = "/usr/share/datasets/fashion-mnist";
  int64_t train_limit = 0;  // 0: the whole training set
  int64_t test_limit = 0;
  Normalize normalize;
};

// How a run reports: the seeds' log lines, a progress line on terminals, files.
enum class ProgressMode { kAuto, kOn, kOff };

struct OutputSettings {
  int64_t log_interval = 100;  // batches between log lines (and metrics records)
  ProgressMode progress = ProgressMode::kAuto;
  std::string trace_path;    // Chrome trace JSON of all ranks
  std::string metrics_path;  // JSON lines, one per log interval and per epoch
  bool json = false;         // a final JSON summary line
  bool quiet = false;        // errors (and --json) only
};

struct TrainConfig {
  DataSettings data;
  ModelSpec model;
  uint64_t seed = 0;  // initialisation, shuffling and dropout
  int64_t epochs = 1;
  int64_t batch_size = 64;  // per rank
  int64_t accumulate = 1;   // micro-batches per optimizer step (no_sync for all but the last)
  OptimizerSpec optimizer;
  LrSchedule::Kind lr_schedule = LrSchedule::Kind::kConstant;
  int64_t lr_step_size = 1;
  float lr_gamma = 0.1f;
  AmpMode amp = AmpMode::kOff;  // bf16: Linear matmuls in bf16, float32 master weights (autocast)
  DdpOptions ddp;
  RuntimeOptions runtime;
  OutputSettings output;
};

struct TrainResult {
  int world_size = 1;
  int64_t train_samples = 0;  // over all ranks and epochs
  double train_seconds = 0;   // training loops only (no evaluation), rank 0's clock
  double samples_per_second = 0;
  double test_loss = 0;
  double test_accuracy = 0;
  double allreduce_overlap = -1;       // fraction of all-reduce time inside backward (with a trace)
  uint64_t parameters_fingerprint = 0;  // this rank's final parameters (model/fingerprint.h)
  std::string device;
};

}  // namespace dtrain
