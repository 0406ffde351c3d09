// TrainConfig: every setting of a `dtrain train` run, typed, as the library layers take them
// (RuntimeOptions, ModelSpec, OptimizerSpec, DdpOptions, ...). The command line is parsed into
// it once, and validated there (app/train_options.h); nothing downstream re-checks a flag.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/runtime.h"
#include "data/data_format.h"
#include "data/distributed_sampler.h"
#include "data/mnist.h"
#include "ddp/distributed_data_parallel.h"
#include "model/amp.h"
#include "model/grad_scaler.h"
#include "model/lr_schedule.h"
#include "model/models.h"
#include "model/optimizer.h"
#include "pipeline/schedule.h"

namespace dtrain {

struct DataSettings {
  std::string dir = "/usr/share/datasets/fashion-mnist";
  int64_t train_limit = 0;  // 0: the whole training set
  int64_t test_limit = 0;
  Normalize normalize;
  bool shuffle = true;  // false: rank r takes samples r, r + N, ... in dataset order (PyTorch's shuffle=False)
  SamplerTail sampler = SamplerTail::kPad;  // uneven: ranks run different numbers of steps (Join)
  int classes = 0;  // 0: the training labels' largest + 1 (a label far above the rest refused); else every label below
  DataFormat format = DataFormat::kAuto;  // --data-format (auto: llmc for --model gpt, else idx)
};

// A language model (`--model gpt`): its shape, and the step-based loop's settings (llm.c's and
// nanoGPT's vocabulary). The shape fields are model/gpt.h's GptSpec.
struct LmSettings {
  int64_t vocab = 0;  // 0: from the data (data/token_shards.h's rule)
  int64_t context = 256;
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t embd = 256;
  int64_t steps = 500;         // optimizer steps (the README's example)
  int64_t eval_every = 0;      // steps between validation losses; 0: at the end only
  int64_t eval_batches = 20;   // validation slots per evaluation over all ranks (llm.c's default)
};

// Where a run starts from and where it saves (app/checkpointing.h).
enum class ResumeMode { kNone, kAuto, kPath };

struct CheckpointSettings {
  std::string dir;        // empty: no checkpoints
  int64_t every = 0;      // optimizer steps between checkpoints; 0: at every epoch end (and always at the end)
  int keep = 2;           // newest checkpoints kept
  bool background = true;  // written on a background thread while training continues
  ResumeMode resume = ResumeMode::kNone;
  std::string resume_path;   // kPath: a checkpoint (DIR/step-N) or a checkpoint directory
  std::string init_weights;  // a safetensors file of parameters to start from (unless resuming)
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

// Note [Pipeline schedules] (pipeline/schedule.h): --pipeline-stages and its flags.
struct PipelineSettings {
  int stages = 1;          // 1: no pipeline (every rank holds the whole model)
  int micro_batches = 0;   // per replica's batch; 0: as many as stages
  PipelineSchedule schedule = PipelineSchedule::k1f1b;
  std::vector<size_t> split;  // the first layer of stages 1..P-1; empty: balanced by parameters
};

struct TrainConfig {
  DataSettings data;
  ModelSpec model;  // mlp or cnn (unused with `lm`)
  std::optional<LmSettings> lm;  // set: --model gpt, trained for lm->steps optimizer steps
  uint64_t seed = 0;  // initialisation, shuffling and dropout
  int64_t epochs = 1;
  int64_t batch_size = 64;  // per rank
  int64_t accumulate = 1;   // micro-batches per optimizer step (no_sync for all but the last)
  OptimizerSpec optimizer;
  LrSchedule::Kind lr_schedule = LrSchedule::Kind::kConstant;  // per epoch; with `lm` per step (none or cosine)
  int64_t lr_step_size = 1;
  float lr_gamma = 0.1f;
  int64_t warmup_steps = 0;  // lm: linear warm-up steps
  float min_lr = 0.f;        // lm cosine: the last step's lr (default lr / 10)
  float clip_grad_norm = 0.f;  // the largest global gradient norm (after the all-reduce); 0: no clipping
  // --class-weights: the training loss's weight of each class (gpt: of each token id), PyTorch's
  // CrossEntropyLoss(weight=...); empty: unweighted. Each finite and >= 0, one positive; the count
  // is checked against the data's classes once they are known (check_class_weights).
  std::vector<float> class_weights;
  AmpMode amp = AmpMode::kOff;  // bf16/fp16: Linear and Conv matmuls in 16 bits, float32 master weights (autocast)
  GradScalerSettings loss_scale;  // --amp fp16: the loss scaling (model/grad_scaler.h)
  DdpOptions ddp;
  PipelineSettings pipeline;
  RuntimeOptions runtime;
  CheckpointSettings checkpoints;
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
  int64_t global_step = 0;  // optimizer steps since the first run's start (resumes included)
  // A SIGTERM or SIGINT stopped the run at a step boundary (0: it ran to the end). Then every
  // rank has stopped at the same step and rank 0 has saved a checkpoint if it had a directory.
  int stop_signal = 0;
  // --model gpt: tokens over all ranks per second of the training loops (evaluations excluded),
  // the last step's training loss (mean over ranks), the last validation loss, the parameters.
  double tokens_per_second = 0;
  double train_loss = 0;
  double val_loss = 0;
  int64_t parameters = 0;
  // A NaN or an infinity stopped the run (app/divergence.h): every rank stopped at the same
  // step, rank 0 said what, and no checkpoint was written from it.
  bool diverged = false;
};

}  // namespace dtrain
