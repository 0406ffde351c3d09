// PipelineStage (see pipeline_stage.h).
#include "pipeline/pipeline_stage.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "core/error.h"
#include "comm/flight_recorder.h"
#include "core/ops.h"

namespace dtrain {

namespace {

constexpr int kShapeTag = kMaxP2pTag;  // above every micro-batch's tags (M <= 8191)
constexpr int kMaxDims = 7;
constexpr int kEvalTag = kMaxP2pTag - 1;  // evaluation activations (also above the micro-batches')
constexpr int kTiedTag = kMaxP2pTag - 2;  // Note [Tied stages]: the shared parameter's value, then gradients

std::vector<uint64_t> read_counters(Module& m) {
  std::vector<uint64_t> out;
  for (uint64_t* c : m.rng_counters()) out.push_back(*c);
  return out;
}

void write_counters(Module& m, const std::vector<uint64_t>& values) {
  size_t i = 0;
  for (uint64_t* c : m.rng_counters()) *c = values.at(i++);
}

// Note [Pipeline BatchNorm]: copies of the stage's buffers (BatchNorm's running statistics), to
// put back after a forward that must not count (the shape probe, a recomputation, a joined step).
std::vector<Tensor> read_buffers(Module& m) {
  std::vector<Tensor> out;
  for (Buffer* b : m.buffers()) {
    out.push_back(Tensor::empty(b->value.shape(), b->value.device(), b->value.dtype()));
    out.back().copy_from(b->value);
  }
  return out;
}

void write_buffers(Module& m, const std::vector<Tensor>& values) {
  size_t i = 0;
  for (Buffer* b : m.buffers()) b->value.copy_from(values.at(i++));
}

}  // namespace

PipelineStage::PipelineStage(std::unique_ptr<Sequential> module, PipelineGrid& grid, PipelineOptions options)
    : module_(std::move(module)),
      grid_(grid),
      options_(options),
      first_(grid.stage == 0),
      last_(grid.stage == grid.stages - 1),
      device_(options.device),
      program_(stage_program(options.schedule, grid.stages, options.micro_batches, grid.stage)),
      slots_(dtrain::peak_held_inputs(stage_actions(options.schedule, grid.stages, options.micro_batches, grid.stage))),
      loss_(options_.class_weights.empty() ? Reduction::kMean : Reduction::kSum, options_.class_weights) {
  DTRAIN_CHECK(!device_.is_cuda() || (grid_.device_chain && grid_.device_data_parallel),
               "pipeline stage {}: on {} the grid needs its device communicators (Note [Pipeline on a GPU])",
               grid_.stage, device_.str());
  // The replicas of a stage start from replica 0's parameters.
  if (grid_.replicas > 1)
    for (Parameter* p : module_->parameters()) grid_.tensor_group().broadcast(p->value, 0);
  module_->set_grad_ready_hook([this](Parameter& p) { issue_gradient_sum(p); });
  if (options_.tied_parameter.empty() || grid_.stages == 1 || (!first_ && !last_)) return;
  for (Parameter* p : module_->parameters())
    if (p->name == options_.tied_parameter) tied_ = p;
  DTRAIN_CHECK(tied_, "pipeline stage {}: no parameter {} to tie between the first and the last stage", grid_.stage,
               options_.tied_parameter);
  // Note [Tied stages]: the last stage starts from stage 0's copy.
  Tensor& v = tied_->value;
  Communicator& chain = grid_.tensor_chain();
  order_after(compute_stream(v.device()), chain);  // after the kernels that initialised it
  if (first_) chain.send(v.raw(), v.numel(), v.dtype(), grid_.stages - 1, kTiedTag);
  else chain.recv(v.raw(), v.numel(), v.dtype(), 0, kTiedTag);
  tied_peer_grad_ = Tensor::empty(v.shape(), v.device());
}

void PipelineStage::sum_tied_gradients() {
  // Note [Tied stages]: after the replicas' sums, so each copy's gradient is the global batch's;
  // without them (ZeRO-2) replica d's two ends add their local gradients, a_d + b_d, and the
  // reduce-scatter that follows sums those over the replicas for both copies alike.
  const int64_t start = steady_now_ns();
  Tensor& g = tied_->grad;
  const int peer = first_ ? grid_.stages - 1 : 0;
  Communicator& chain = grid_.tensor_chain();
  order_after(compute_stream(g.device()), chain);
  const ScopedCollectiveDetail detail(fmt::format("pipeline stage {}: tied {}", grid_.stage, tied_->name));
  chain
      .batch_p2p_async({{P2pOp::kSend, g.raw(), g.numel(), g.dtype(), peer, kTiedTag},
                         {P2pOp::kRecv, tied_peer_grad_.raw(), g.numel(), g.dtype(), peer, kTiedTag}})
      ->wait();
  axpy(g, tied_peer_grad_, 1.f);  // mine + the peer's, and the peer adds mine to its: the same bits
  spans_.push_back({PipeSpan::kTransfer, -1, start, steady_now_ns()});
}

float PipelineStage::global_weight_sum(const Tensor& labels, bool joined) {
  // Note [Pipeline class weights]: w[y] added in row order (the loss kernel's order: at D = 1 the
  // unsplit model's float), then over the last stage's replicas.
  const Tensor host = labels.to(Device::cpu());
  const int32_t* y = host.data_as<int32_t>();
  const auto classes = static_cast<int32_t>(options_.class_weights.size());
  float sum = 0.f;  // a joined replica's (Note [Pipeline Join]): none
  for (int64_t i = 0; !joined && i < host.numel(); ++i)
    sum += y[i] >= 0 && y[i] < classes ? options_.class_weights[static_cast<size_t>(y[i])] : 0.f;
  if (grid_.replicas > 1) {
    const ScopedCollectiveDetail detail(fmt::format("pipeline stage {}: the class weights' sum", grid_.stage));
    grid_.data_parallel->allreduce(&sum, 1, DType::kF32, ReduceOp::kSum);
  }
  return sum;
}

void PipelineStage::issue_gradient_sum(Parameter& p) {
  if (!summing_ || grid_.replicas == 1 || !options_.sum_gradients) return;
  // Note [Pipeline loss]: already scaled by 1/(M x D); the group's sum completes the mean. Every
  // replica's backward makes the parameters ready in the same order, so the sums line up.
  sums_.push_back(allreduce_after(compute_stream(p.grad.device()), grid_.tensor_group(), p.grad.raw(),
                                  p.grad.numel(), p.grad.dtype(), ReduceOp::kSum));
}

void PipelineStage::prepare(const Tensor& input, int64_t rows) {
  // The micro-batch's shape travels down the chain every step (a few bytes): stage s learns its
  // input's from s-1 (the middle stages see no batch) and its output's by a forward on zeros
  // (its random-number state put back afterwards) when the shape changed.
  int32_t header[kMaxDims + 1] = {};
  Shape in_shape;
  if (first_) {
    DTRAIN_CHECK(input.defined() && input.ndim() >= 1, "pipeline stage 0 needs the batch's input");
    in_shape = input.shape();
    in_shape[0] = rows;
  } else {
    grid_.chain->recv(header, kMaxDims + 1, DType::kI32, grid_.stage - 1, kShapeTag);
    in_shape.assign(header + 1, header + 1 + header[0]);
    DTRAIN_CHECK(rows == 0 || in_shape[0] == rows, "pipeline stage {}: micro-batches of {} rows from stage {}, {} here",
                 grid_.stage, in_shape[0], grid_.stage - 1, rows);
  }
  const bool same = in_shape == in_shape_;
  rows_ = in_shape[0];
  in_shape_ = in_shape;
  const Device device = device_;
  DTRAIN_CHECK(!input.defined() || input.device() == device, "pipeline stage {}: the batch is on {}, the stage on {}",
               grid_.stage, input.device().str(), device.str());
  if (!same) {
    const std::vector<uint64_t> counters = read_counters(*module_);
    const std::vector<Tensor> buffers = read_buffers(*module_);
    // Stage 0's input keeps its type (a language model's int32 tokens: zeros are valid ids).
    out_shape_ = module_->forward(Tensor::zeros(in_shape_, device, first_ ? input.dtype() : DType::kF32)).shape();
    write_counters(*module_, counters);
    write_buffers(*module_, buffers);
    last_forward_ = -1;
  }
  if (!last_) {
    DTRAIN_CHECK(static_cast<int>(out_shape_.size()) <= kMaxDims, "pipeline stage {}: an output of {} dimensions",
                 grid_.stage, out_shape_.size());
    header[0] = static_cast<int32_t>(out_shape_.size());
    for (size_t i = 0; i < out_shape_.size(); ++i) header[i + 1] = static_cast<int32_t>(out_shape_[i]);
    grid_.chain->send(header, kMaxDims + 1, DType::kI32, grid_.stage + 1, kShapeTag);
  }
  if (same) return;
  // Note [Pipeline buffers]: a micro-batch's input (and, on the last stage, its loss gradient)
  // lives from its forward to its backward: slots_ of them, reused round robin (the schedule's
  // peak: GPipe M, 1F1B P - s). An output or an input gradient lives from its action to the
  // next transfer batch, which completes before the next action: one each; so does a received
  // gradient, received right before its backward.
  const auto S = static_cast<size_t>(slots_);
  act_in_.assign(first_ ? 0 : S, Tensor{});
  grad_in_.assign(last_ ? S : 1, Tensor{});
  act_out_.assign(last_ ? 0 : 1, Tensor{});
  grad_out_.assign(first_ ? 0 : 1, Tensor{});
  for (Tensor& t : act_in_) t = Tensor::empty(in_shape_, device);
  for (Tensor& t : grad_in_) t = Tensor::empty(out_shape_, device);
  for (Tensor& t : act_out_) t = Tensor::empty(out_shape_, device);
  for (Tensor& t : grad_out_) t = Tensor::empty(in_shape_, device);
  rng_at_.assign(static_cast<size_t>(options_.micro_batches), {});
}

void PipelineStage::run_transfers(const std::vector<PipeTransfer>& transfers) {
  if (transfers.empty()) return;
  const int64_t start = steady_now_ns();
  std::vector<P2pOp> ops;
  for (const PipeTransfer& t : transfers) {
    const auto m = static_cast<size_t>(t.micro_batch);
    Tensor* buf = nullptr;
    switch (t.kind) {
      case PipeTransfer::kSendActivation: buf = &act_out_[0]; break;
      case PipeTransfer::kRecvActivation: buf = &act_in_[m % slots()]; break;
      case PipeTransfer::kSendGrad: buf = &grad_out_[0]; break;
      case PipeTransfer::kRecvGrad: buf = &grad_in_[grad_slot(t.micro_batch)]; break;
    }
    ops.push_back({t.is_send() ? P2pOp::kSend : P2pOp::kRecv, buf->raw(), buf->numel(), buf->dtype(), t.peer_stage,
                   t.tag()});
  }
  // Sends read buffers the compute stream wrote, and receives overwrite buffers its queued
  // kernels may still read (Note [Ordering a collective after its producer]); the wait orders
  // the compute stream after the batch (on a GPU without blocking the host).
  Communicator& chain = grid_.tensor_chain();
  order_after(compute_stream(device_), chain);
  const ScopedCollectiveDetail detail(fmt::format("pipeline stage {}", grid_.stage));
  chain.batch_p2p_async(std::move(ops))->wait();
  spans_.push_back({PipeSpan::kTransfer, -1, start, steady_now_ns()});
}

Tensor PipelineStage::stage_input(int m, const Tensor& input) {
  if (!first_) return act_in_[static_cast<size_t>(m) % slots()];
  const int64_t per_row = shape_numel(in_shape_) / rows_;
  return input.slice(m * rows_ * per_row, in_shape_);
}

void PipelineStage::forward(int m, const Tensor& input, const Tensor& labels) {
  const int64_t start = steady_now_ns();
  const auto mi = static_cast<size_t>(m);
  rng_at_[mi] = read_counters(*module_);
  Tensor out = module_->forward(stage_input(m, input));
  last_forward_ = m;
  if (last_ && part_.joined) {
    fill(grad_in_[grad_slot(m)], 0.f);  // Note [Pipeline Join]: nothing of this replica's own
  } else if (last_) {
    const int64_t per_micro_batch = labels.numel() / options_.micro_batches;  // rows_, or rows_ x T tokens
    const Tensor y = labels.slice(m * per_micro_batch, {per_micro_batch});
    loss_sum_ += loss_value(loss_.forward(out, y));
    correct_ += count_correct(out, y);
    Tensor& g = grad_in_[grad_slot(m)];
    g.copy_from(loss_.backward());
    // Note [Pipeline loss]; times the fp16 loss scale (a power of 2: the same bits as scaling after).
    if (options_.class_weights.empty())
      scale(g, part_.loss_scale / static_cast<float>(options_.micro_batches * grid_.replicas * part_.count));
    else  // Note [Pipeline class weights]: the weighted sum over the global weight sum
      scale(g, weight_total_ > 0.f ? part_.loss_scale / (weight_total_ * static_cast<float>(part_.count)) : 0.f);
  } else {
    act_out_[0].copy_from(out);  // the layer reuses its output buffer in the next forward
  }
  peak_held_ = std::max(peak_held_, ++held_);
  spans_.push_back({PipeSpan::kForward, m, start, steady_now_ns()});
}

void PipelineStage::backward(int m, const Tensor& input) {
  const int64_t start = steady_now_ns();
  const auto mi = static_cast<size_t>(m);
  if (last_forward_ != m) {
    // Note [Recomputed activations]: the same random numbers as the first time, then back.
    const std::vector<uint64_t> now = read_counters(*module_);
    const std::vector<Tensor> buffers = read_buffers(*module_);  // Note [Pipeline BatchNorm]
    write_counters(*module_, rng_at_[mi]);
    module_->forward(stage_input(m, input));
    write_counters(*module_, now);
    write_buffers(*module_, buffers);
    last_forward_ = m;
  }
  // The last backward of the optimizer step, in both schedules.
  summing_ = m == options_.micro_batches - 1 && part_.index == part_.count - 1;
  Tensor g = module_->backward(grad_in_[grad_slot(m)], /*need_input_grad=*/!first_);
  summing_ = false;
  if (!first_) grad_out_[0].copy_from(g);
  --held_;
  spans_.push_back({PipeSpan::kBackward, m, start, steady_now_ns()});
}

PipelineStage::Result PipelineStage::train_step(const Tensor& input, const Tensor& labels, PipelineStepPart part) {
  const int M = options_.micro_batches;
  DTRAIN_CHECK(part.count >= 1 && part.index >= 0 && part.index < part.count, "pipeline: step part {} of {}",
               part.index, part.count);
  part_ = part;
  int64_t rows = 0;
  if (first_) rows = input.dim(0);
  if (last_) {
    DTRAIN_CHECK(labels.defined(), "pipeline: the last stage needs the batch's labels");
    DTRAIN_CHECK(!first_ || labels.dim(0) == rows, "pipeline: {} labels for {} rows", labels.dim(0), rows);
    rows = labels.dim(0);  // [B] or [B, T]: B rows
  }
  if (rows % M != 0)
    throw Error(fmt::format("the batch of {} rows is not a multiple of the {} micro-batches", rows, M));
  prepare(input, rows / M);
  if (last_ && !options_.class_weights.empty()) weight_total_ = global_weight_sum(labels, part.joined);
  // Note [Pipeline BatchNorm]: the stage's replicas start each optimizer step from replica 0's
  // running statistics (DDP's buffer broadcast, over the stage's group).
  if (part.index == 0 && grid_.replicas > 1)
    for (Buffer* b : module_->buffers()) grid_.tensor_group().broadcast(b->value, 0);
  // Note [Pipeline Join]: a joined step's forwards leave the counters and statistics as they were.
  const std::vector<uint64_t> counters = part.joined ? read_counters(*module_) : std::vector<uint64_t>{};
  const std::vector<Tensor> buffers = part.joined ? read_buffers(*module_) : std::vector<Tensor>{};
  const int64_t step_start = steady_now_ns();
  spans_.clear();
  sums_.clear();
  held_ = peak_held_ = 0;
  loss_sum_ = 0;
  correct_ = 0;
  for (const PipeStep& step : program_) {
    run_transfers(step.transfers);
    if (!step.has_action) continue;
    if (step.action.kind == PipeAction::kForward) forward(step.action.micro_batch, input, labels);
    else backward(step.action.micro_batch, input);
  }
  for (WorkHandle& w : sums_) w->wait();
  sums_.clear();
  if (part.joined) {
    write_counters(*module_, counters);
    write_buffers(*module_, buffers);
  }
  // Once per optimizer step, on its accumulated gradients: each end adds the other's copy, so a
  // sum in every part would add the earlier parts' twice.
  if (tied_ && part.index == part.count - 1) sum_tied_gradients();
  step_ns_ += steady_now_ns() - step_start;
  for (const PipeSpan& s : spans_)
    if (s.kind != PipeSpan::kTransfer) busy_ns_ += s.end_ns - s.start_ns;
  Result r;
  // With class weights: this replica's share of the global weighted mean, times D, so the
  // replicas' average is that mean.
  const double mean = options_.class_weights.empty()
                          ? loss_sum_ / M
                          : (weight_total_ > 0.f ? loss_sum_ * grid_.replicas / weight_total_ : 0.0);
  r.loss = last_ ? static_cast<float>(mean) : std::numeric_limits<float>::quiet_NaN();
  r.correct = correct_;
  return r;
}

PipelineStage::Evaluated PipelineStage::evaluate_batch(const Tensor& input, const Tensor& labels) {
  module_->set_training(false);
  int32_t header[kMaxDims + 1] = {};
  Tensor x = input;
  Communicator& chain = grid_.tensor_chain();
  if (!first_) {
    // The shape on the host's chain, the activations on the device's (Note [Pipeline on a GPU]).
    grid_.chain->recv(header, kMaxDims + 1, DType::kI32, grid_.stage - 1, kShapeTag);
    x = Tensor::empty(Shape(header + 1, header + 1 + header[0]), device_);
    order_after(compute_stream(device_), chain);
    chain.recv(x.raw(), x.numel(), x.dtype(), grid_.stage - 1, kEvalTag);
  }
  Tensor out = module_->forward(x);
  Evaluated e;
  if (last_) {
    e.loss_sum = static_cast<double>(loss_value(eval_loss_.forward(out, labels))) * static_cast<double>(labels.numel());
    e.correct = count_correct(out, labels);
  } else {
    header[0] = static_cast<int32_t>(out.ndim());
    for (int i = 0; i < out.ndim(); ++i) header[i + 1] = static_cast<int32_t>(out.dim(i));
    grid_.chain->send(header, kMaxDims + 1, DType::kI32, grid_.stage + 1, kShapeTag);
    order_after(compute_stream(device_), chain);  // after the forward that wrote it
    chain.send(out.raw(), out.numel(), out.dtype(), grid_.stage + 1, kEvalTag);
  }
  module_->set_training(true);
  last_forward_ = -1;  // the layers now hold the evaluation's forward
  return e;
}

}  // namespace dtrain
