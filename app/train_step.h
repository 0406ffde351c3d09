// One micro-batch's forward and backward, shared by the image loop (app/trainer.cpp) and the
// language-model loop (app/lm_trainer.cpp): model -> cross-entropy -> backward, through DDP when
// there is more than one rank (no_sync for every micro-batch but a step's last), the loss
// gradient divided by the step's micro-batch count so the step sees their mean (and multiplied
// by the fp16 loss scale). Then the gate between the gradient all-reduce and the optimizer step.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/trace.h"
#include "app/train_config.h"
#include "core/tensor.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/loss_scaling.h"
#include "model/loss.h"
#include "model/module.h"

namespace dtrain {

// Micro-batch i of an epoch (or of the rest of one) of `batches` batches that starts at an
// optimizer-step boundary: its place in its step, the number of micro-batches in that step (the
// last step of an epoch may be shorter) and whether the step ends with it.
struct MicroBatch {
  int64_t index_in_step = 0;
  int64_t step_size = 1;
  bool ends_step = true;
};

// (--accumulate: the image loop's and the pipeline's.) Pure.
MicroBatch micro_batch(int64_t i, int64_t batches, int64_t accumulate);

struct MicroStep {
  int64_t step_size = 1;  // micro-batches in this optimizer step
  bool ends_step = true;  // the step's last: its backward all-reduces
  float loss_scale = 1.f;  // --amp fp16: the loss gradient's multiplier (Note [Loss scaling])
};

// Returns the micro-batch's loss (a one-element device tensor). `ddp` is null on one rank.
Tensor forward_backward(Module& model, DistributedDataParallel* ddp, CrossEntropyLoss& loss_fn, Tracer& tracer,
                        const Tensor& input, const Tensor& targets, const MicroStep& micro);

// Adds a float over the ranks of `comm` on the host (collective): what --clip-grad-norm needs
// under ZeRO-2, where each rank holds its chunks of the gradient (model/grad_clip.h).
std::function<float(float)> host_sum_over_ranks(Communicator& comm);

// Steps whose gradients the test hook DTRAIN_TEST_POISON_GRADS makes infinite after the
// all-reduce, as an fp16 overflow would: "3,7@1" poisons step 3 on every rank and step 7 on rank
// 1 only (steps count from 1 over the run). Unset: none.
class GradPoison {
 public:
  static constexpr const char* kEnv = "DTRAIN_TEST_POISON_GRADS";
  GradPoison(const char* spec, int rank);  // throws UsageError on a malformed spec
  bool hits(int64_t step) const;
  // One element of the first written gradient becomes +inf.
  static void poison(const std::vector<Parameter*>& params);

 private:
  std::vector<int64_t> steps_;
};

// Between the gradient all-reduce and the optimizer step (Note [Loss scaling]): under --amp fp16
// the gradients are unscaled and checked and the ranks agree whether to step; otherwise every
// step is taken.
class StepGate {
 public:
  StepGate(const TrainConfig& config, Runtime& runtime, std::vector<Parameter*> params);
  // What forward_backward multiplies the loss gradient by (1 without fp16).
  float loss_scale() const { return scaling_ ? scaling_->scale() : 1.f; }
  // After optimizer step `step`'s (from 1) gradient all-reduce: true when it is to be taken
  // (then clip and step). Collective under fp16.
  bool pass(int64_t step);
  // The scale's state (null without fp16): for log lines, metrics and checkpoints.
  const GradScalerState* state() const { return scaling_ ? &scaling_->scaler().state() : nullptr; }
  nlohmann::json state_json() const;  // null without fp16
  // From a checkpoint's state (a null `saved`: nothing to restore). Throws Error naming the field.
  void restore(const nlohmann::json& saved, const std::string& source);
  // The warning line, once, when the scale has fallen below 1 (apex#715: a scale that collapses
  // silently); "" otherwise.
  std::string take_warning();

 private:
  std::vector<Parameter*> params_;
  std::optional<LossScaling> scaling_;
  GradPoison poison_;
  bool warned_ = false;
};

}  // namespace dtrain
