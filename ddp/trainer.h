// The training loop behind `dtrain train`: data-parallel whenever the world has more than one
// rank. Data (sharded by DistributedSampler) -> model -> cross-entropy -> DDP backward ->
// optimizer; rank 0 logs in the seeds' format; test accuracy on a sharded test set, all-reduced.
#pragma once

#include <cstdint>
#include <string>

#include "comm/communicator.h"
#include "model/amp.h"
#include "model/lr_schedule.h"
#include "model/models.h"

namespace dtrain {

struct TrainConfig {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  ModelSpec model;
  int64_t epochs = 1;
  int64_t batch_size = 64;  // per rank
  std::string optimizer = "sgd";  // sgd | adamw
  float lr = 0.01f;
  float momentum = 0.9f;
  bool nesterov = false;
  float weight_decay = 0.f;
  LrSchedule::Kind lr_schedule = LrSchedule::Kind::kConstant;
  int64_t lr_step_size = 1;
  float lr_gamma = 0.1f;
  uint64_t seed = 0;
  std::string device = "auto";
  bool allow_gpu_sharing = false;
  bool tf32 = false;
  AmpMode amp = AmpMode::kOff;  // bf16: Linear matmuls in bf16, float32 master weights (autocast)
  double timeout_s = 600;  // per-collective timeout on NCCL (PyTorch's default: 10 minutes)
  int64_t log_interval = 100;  // batches
  int64_t accumulate = 1;      // micro-batches per optimizer step (no_sync for all but the last)
  double bucket_cap_mb = 25.0;
  bool find_unused_parameters = false;
  std::string comm_hook = "allreduce";
  std::string trace_path;
  int64_t train_limit = 0;  // 0: the whole training set
  int64_t test_limit = 0;
  float norm_mean = 0.f, norm_std = 1.f;
  int threads = 0;  // BLAS threads per rank; 0: cores / local ranks (or OPENBLAS_NUM_THREADS)
  bool quiet = false;
  bool json = false;
};

struct TrainResult {
  int world_size = 1;
  int64_t train_samples = 0;  // over all ranks and epochs
  double train_seconds = 0;   // training loops only (no evaluation), rank 0's clock
  double samples_per_second = 0;
  double test_loss = 0;
  double test_accuracy = 0;
  double allreduce_overlap = -1;  // fraction of all-reduce time inside backward (with --trace)
  uint64_t parameters_fingerprint = 0;  // this rank's final parameters (model/fingerprint.h)
  std::string device;
};

TrainResult train(const TrainConfig& config, Communicator& comm);

}  // namespace dtrain
