// PipelineStage: one rank's stage of a pipeline-parallel model (Note [Pipeline schedules],
// Note [Pipeline grid]). It holds only its own layers (their parameters keep the unsplit
// model's names), runs its schedule's forward and backward actions on the micro-batches of a
// step, exchanges activations and their gradients with the neighbouring stages by point-to-
// point batches over the grid's chain, and sums its gradients over its data-parallel group
// while the last micro-batch's backward runs.
//
// Note [Pipeline loss]: the loss is the mean over the global batch (D replicas x B rows): the
// last stage scales each micro-batch's mean-loss gradient by 1/(M x D) and the replicas' sum
// completes it, so gradients equal the unsplit model's on the whole batch (to rounding: one GEMM
// over B rows becomes M accumulated ones). With gradient accumulation (--accumulate A) an
// optimizer step is A pipeline steps: each micro-batch's gradient is scaled by 1/(M x D x A), the
// gradients add up over the A steps, and only the last one's backward sums them over the
// replicas (the others' are no_sync), so the step sees the mean over A x D x B rows.
//
// Note [Pipeline class weights]: with class weights the loss is the weighted mean over the GLOBAL
// batch, sum of w[y] x loss / sum of w[y] over all M micro-batches and D replicas (the unsplit
// model's CrossEntropyLoss(weight=...) on the D x B rows), not a mean of per-micro-batch means:
// a micro-batch's weight sum differs from another's. The last stage adds its batch's w[y] (in
// row order, as the loss kernel does) and sums that over its replicas before the step's first
// forward; each micro-batch's loss is then the weighted SUM, its gradient scaled by 1 / (that
// global sum x A). At D = 1 and A = 1 the loss gradient is the unsplit model's bit for bit.
//
// Note [Pipeline Join]: with --sampler uneven each replica reads its own share of the epoch (no
// repeated samples) in full batches, so replicas may run different numbers of steps (shares
// differ by at most one sample: by one batch at most). While any replica has a batch (one vote
// over the world per step, ddp/join.h) a replica without one runs the step JOINED on every one
// of its stages: its stage 0 feeds zeros, its last stage's loss gradient is zero (and it adds
// no class weight), so its gradients are zero, and it takes part in every transfer of its own
// pipeline and every sum over its stage's replicas (the per-parameter all-reduces, ZeRO-2's
// reduce-scatter, the tied wte's exchange, the weight sum) as the replicas with data expect. The
// step's gradient is then the sum over the replicas with data, still scaled by 1/(M x D): PyTorch
// DDP + Join's divide_by_initial_world_size, as the data-parallel trainer's Join. The cost: one
// forward and backward of zeros per joined step (at most one a replica an epoch), which keeps
// the collectives exactly those of a real step.
//
// Note [Pipeline BatchNorm] (--model resnet18, Note [ResNet pipeline stages] in model/models.h):
// a BatchNorm layer in training normalises each micro-batch on its own B/M rows and moves its
// running statistics once per micro-batch forward, as the unsplit model trained on the same rows
// with --accumulate M does (GPipe's semantics). Forwards that must not count put the statistics
// back: the shape probe, each recomputation (Note [Recomputed activations]) and a joined step.
// A stage's replicas start each optimizer step from replica 0's statistics (DDP's buffer
// broadcast, over the stage's group), so replica 0 holds the unsplit model's. Evaluation runs
// each replica on its own statistics, moved by its last step's rows, as DDP's ranks evaluate. A
// checkpoint saves replica 0's (Note [Pipeline checkpoints] in train/checkpointer.h) and a resume
// gives every replica the same.
//
// Note [Pipeline SyncBatchNorm]: with --sync-bn each BatchNorm of a stage takes a micro-batch's
// statistics over the stage's replicas (the app converts the stage's layers over
// grid.tensor_group(): ddp/sync_batchnorm.h). Replica d's batch is positions d, d + D, ... of the
// global batch (DistributedSampler), so the replicas' micro-batch m together is micro-batch m of
// the P x 1 run at D times the batch: the same statistics up to float rounding (which BatchNorm
// amplifies over the steps, as in the data-parallel SyncBatchNorm run against np 1), and bit for
// bit the data-parallel --sync-bn run with --accumulate M; the replicas' running statistics stay
// alike. Every replica of a stage runs the same schedule, so the
// training forwards (shape probe and recomputations included) and backwards meet in the same
// order; a joined step would not, which the CLI refuses (--sync-bn with --sampler uneven).
//
// Note [Recomputed activations]: a layer keeps what its backward needs from its last forward
// only. A stage therefore holds each micro-batch's stage input from its forward to its backward
// (the "held inputs": GPipe M, 1F1B at most P - s) and runs that micro-batch's forward again
// right before its backward, unless it was the stage's last forward (the last stage in 1F1B,
// every stage's last micro-batch). The recomputation replays the same random numbers (rng
// counters saved and restored), so the result is what a stored activation would give, at the
// cost of up to one extra forward per micro-batch.
//
// Note [Pipeline dropout]: Dropout's mask element i of a forward is hash(seed, counter + i), the
// counter advancing by the forward's numel (model/activation.h), and each layer's seed is the
// unsplit model's (built by its place in the whole model). A stage's first forwards run in
// micro-batch order in both schedules, micro-batch m's rows being rows m x B/M.. of the batch, so
// layer l's counter before it is c + m x (B/M) x width: the unsplit model's forward draws exactly
// these numbers for those rows. The shape probe and the recomputed forwards put the counters back,
// so the masks, and the weights, are the unsplit model's (each replica's those of a data-parallel
// rank). A checkpoint gathers the stages' counters into the unsplit model's list; on --resume a
// stage takes its own back from it, those of the Dropout layers at its layers' places in the
// unsplit model (dropout_layer_places in model/models.h), whatever P x D (or data-parallel run)
// saved it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "model/loss.h"
#include "model/sequential.h"
#include "pipeline/grid.h"
#include "pipeline/schedule.h"

namespace dtrain {

struct PipelineOptions {
  PipelineOptions(PipelineSchedule schedule_ = PipelineSchedule::k1f1b, int micro_batches_ = 1,
                  std::string tied_parameter_ = "")
      : schedule(schedule_), micro_batches(micro_batches_), tied_parameter(std::move(tied_parameter_)) {}
  PipelineSchedule schedule = PipelineSchedule::k1f1b;
  int micro_batches = 1;
  // Note [Tied stages]: the name of a parameter that the first and the last stage both hold (the
  // GPT's transformer.wte.weight, its embedding and its output layer: Note [GPT pipeline
  // stages] in model/gpt.h); "" for none. At construction the last stage takes stage 0's
  // value; after each optimizer step's gradient sums (in its last PipelineStepPart) the two
  // copies' gradients are added (each end adds the other's: a + b == b + a bit for bit), so both
  // take the same optimizer update and stay bitwise equal. Nothing at P = 1. With sum_gradients
  // false (ZeRO-2) the two ends of each replica's pipeline add their local gradients instead, and
  // the caller's reduce-scatter sums a_d + b_d over the replicas for both copies: each element in
  // the same order on both stages (the reduce-scatter sums each element as the all-reduce does:
  // in rank order on one node), so the copies stay bitwise equal; within rounding of the summed
  // copies' sum_d a_d + sum_d b_d.
  std::string tied_parameter;
  // false: the stage leaves its gradients unsummed over its replicas, for the caller to sum (ZeRO-2
  // reduce-scatters them after the step's last backward: Note [Pipeline ZeRO-1] in
  // app/pipeline_zero.h).
  bool sum_gradients = true;
  // Where the stage's layers and its transfer buffers live. On a GPU the grid needs its device
  // communicators (Note [Pipeline on a GPU] in pipeline/grid.h).
  Device device = Device::cpu();
  // Note [Pipeline class weights]: the training loss's class weights (--class-weights; empty:
  // the plain mean). The evaluation's loss stays unweighted.
  std::vector<float> class_weights;
};

// One action's time on this stage, for traces: forward, backward, or the wait in a transfer batch.
struct PipeSpan {
  enum Kind { kForward, kBackward, kTransfer } kind = kForward;
  int micro_batch = -1;  // -1: a transfer batch
  int64_t start_ns = 0, end_ns = 0;
};

// Which of an optimizer step's `count` pipeline steps one is (--accumulate): the gradients are
// summed over the stage's replicas on the last only (Note [Pipeline loss]).
struct PipelineStepPart {
  int64_t index = 0;
  int64_t count = 1;
  // --amp fp16: the loss gradient's multiplier on the last stage (Note [Loss scaling] in
  // model/grad_scaler.h), so the activation gradients sent down the chain and every stage's
  // parameter gradients are scaled alike; the gradients are unscaled after the step.
  float loss_scale = 1.f;
  // Note [Pipeline Join]: this replica has no batch this step (--sampler uneven): the step runs on
  // the caller's zeros with a zero loss gradient, so every transfer and every sum over the
  // replicas happens as the others expect, with nothing of this replica's own; its random-number
  // counters are put back after it.
  bool joined = false;
};

class PipelineStage {
 public:
  // `grid` must outlive the stage. Parameters are broadcast from replica 0 of the stage's group
  // (collective over it), as DDP does.
  PipelineStage(std::unique_ptr<Sequential> module, PipelineGrid& grid, PipelineOptions options);

  // One step's forwards and backwards over this replica's batch of B rows: stage 0 reads `input`
  // [B, ...], the last stage `labels` (int32) [B], or [B, T] for a language model (a micro-batch's
  // labels are its rows' T each, flattened for the loss); the other arguments may be undefined. B must
  // be a multiple of the micro-batch count (one line otherwise). On return the stage's gradients
  // are the global batch's (Note [Pipeline loss]). On the last stage: this replica's mean loss
  // and correct predictions; elsewhere loss NaN, correct 0.
  struct Result {
    float loss = 0;
    int64_t correct = 0;
  };
  // `part`: which of an optimizer step's pipeline steps this is (Note [Pipeline loss]).
  Result train_step(const Tensor& input, const Tensor& labels, PipelineStepPart part = {});

  // Evaluation: the batch forward through the stages in one piece (no micro-batches, no
  // backward), the model in evaluation mode. On the last stage: the loss summed over the rows and
  // the correct predictions; elsewhere zeros. Every stage of the pipeline calls it alike.
  struct Evaluated {
    double loss_sum = 0;
    int64_t correct = 0;
  };
  Evaluated evaluate_batch(const Tensor& input, const Tensor& labels);

  Sequential& module() { return *module_; }
  // The last stage's copy of the tied parameter (Note [Tied stages]), or null: the gradient norm
  // counts the first stage's only.
  const Parameter* tied_copy() const { return last_ ? tied_ : nullptr; }
  const PipelineGrid& grid() const { return grid_; }
  // The most micro-batches whose input this stage held at once in the last step (its input
  // buffers: Note [Pipeline buffers] in pipeline_stage.cpp).
  int peak_held_inputs() const { return peak_held_; }
  const std::vector<PipeSpan>& last_step_spans() const { return spans_; }
  // Of every train_step so far: the time in forwards and backwards, and the steps' wall time
  // (the rest is this stage's idle share: the bubble, and waits in transfers).
  int64_t busy_ns() const { return busy_ns_; }
  int64_t step_ns() const { return step_ns_; }

 private:
  // Finds this stage's input shape (from the previous stage) and output shape for micro-batches
  // of `rows` rows, once per batch size, and allocates the per-micro-batch buffers.
  void prepare(const Tensor& input, int64_t rows);
  void run_transfers(const std::vector<PipeTransfer>& transfers);
  void forward(int m, const Tensor& input, const Tensor& labels);
  void backward(int m, const Tensor& input);
  Tensor stage_input(int m, const Tensor& input);
  void issue_gradient_sum(Parameter& p);
  void sum_tied_gradients();
  float global_weight_sum(const Tensor& labels, bool joined);  // Note [Pipeline class weights]

  std::unique_ptr<Sequential> module_;
  PipelineGrid& grid_;
  PipelineOptions options_;
  bool first_, last_;
  Device device_;  // PipelineOptions::device
  std::vector<PipeStep> program_;
  int64_t rows_ = 0;  // per micro-batch
  Shape in_shape_, out_shape_;
  int slots_;  // Note [Pipeline buffers] (pipeline_stage.cpp)
  size_t slots() const { return static_cast<size_t>(slots_); }
  // The loss gradient (last stage) lives as long as the input; a received gradient is used at once.
  size_t grad_slot(int m) const { return last_ ? static_cast<size_t>(m) % slots() : 0; }
  std::vector<Tensor> act_in_, act_out_, grad_in_, grad_out_;
  std::vector<std::vector<uint64_t>> rng_at_;                  // rng counters before each forward
  CrossEntropyLoss loss_;       // training: the mean, or with class weights the weighted sum
  CrossEntropyLoss eval_loss_;  // evaluation: the unweighted mean
  float weight_total_ = 0;      // Note [Pipeline class weights]: this step's global sum of w[y]
  Parameter* tied_ = nullptr;  // Note [Tied stages]: on the first and the last stage, P > 1
  Tensor tied_peer_grad_;
  int last_forward_ = -1;
  PipelineStepPart part_;
  bool summing_ = false;  // in the last micro-batch's backward: gradients go to the group's sum
  std::vector<WorkHandle> sums_;
  int held_ = 0, peak_held_ = 0;
  std::vector<PipeSpan> spans_;
  int64_t busy_ns_ = 0, step_ns_ = 0;
  double loss_sum_ = 0;
  int64_t correct_ = 0;
};

}  // namespace dtrain
