#include "ddp/distributed_data_parallel.h"

#include <algorithm>

#include <fmt/format.h>

#include "comm/exchange.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/stream.h"
#include "ddp/sync_batchnorm.h"

namespace dtrain {

namespace {

double mib(size_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// One entry per parameter ("name shape"), then one per buffer ("buffer:name shape"); `text` is
// the entries joined with newlines, the form rank 0 broadcasts.
struct ParamSignature {
  std::vector<std::string> names, shapes;
  std::string text;
};

void add_entry(ParamSignature& s, std::string name, std::string shape) {
  s.text += name + " " + shape + "\n";
  s.names.push_back(std::move(name));
  s.shapes.push_back(std::move(shape));
}

ParamSignature signature_of(Module& module) {
  ParamSignature s;
  for (Parameter* p : module.parameters()) add_entry(s, p->name, shape_str(p->value.shape()));
  for (Buffer* b : module.buffers()) add_entry(s, "buffer:" + b->name, shape_str(b->value.shape()));
  return s;
}

ParamSignature parse_signature(const std::string& text) {
  ParamSignature s;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    std::string line = text.substr(start, end - start);
    size_t space = line.find(' ');
    add_entry(s, line.substr(0, space), line.substr(space + 1));
    start = end + 1;
  }
  return s;
}

std::string entry_str(const std::string& name) {
  constexpr std::string_view kBuffer = "buffer:";
  return name.starts_with(kBuffer) ? fmt::format("buffer '{}'", name.substr(kBuffer.size()))
                                   : fmt::format("parameter '{}'", name);
}

std::string first_difference(const ParamSignature& mine, const ParamSignature& root) {
  const size_t n = std::min(mine.names.size(), root.names.size());
  for (size_t i = 0; i < n; ++i) {
    if (mine.names[i] != root.names[i])
      return fmt::format("entry #{} is {} here but {} on rank 0", i, entry_str(mine.names[i]),
                         entry_str(root.names[i]));
    if (mine.shapes[i] != root.shapes[i])
      return fmt::format("{} has shape {} here but {} on rank 0", entry_str(mine.names[i]), mine.shapes[i],
                         root.shapes[i]);
  }
  return fmt::format("{} parameters and buffers here but {} on rank 0", mine.names.size(), root.names.size());
}

}  // namespace

void verify_same_model_on_all_ranks(Module& module, Communicator& comm) {
  ParamSignature mine = signature_of(module);
  // Broadcast rank 0's signature and compare locally: every rank then knows whether it
  // differs, and one all-reduce tells everyone whether anyone does.
  const std::string root_text = broadcast_string(comm, mine.text, 0);
  int32_t differs = root_text != mine.text ? 1 : 0;
  int32_t ranks_differing = differs;
  comm.allreduce(&ranks_differing, 1, DType::kI32, ReduceOp::kSum);
  if (differs)
    throw Error(fmt::format("rank {} disagrees with rank 0 on the model: {}", comm.rank(),
                            first_difference(mine, parse_signature(root_text))));
  if (ranks_differing)
    throw Error(fmt::format("{} rank(s) disagree with rank 0 on the model (their errors name the difference)",
                            ranks_differing));
}

DistributedDataParallel::DistributedDataParallel(Module& module, Runtime& runtime, DdpOptions options)
    : DistributedDataParallel(module, runtime.gradients(), runtime.control(), runtime.compute_stream(), options) {}

DistributedDataParallel::DistributedDataParallel(Module& module, Communicator& gradients, Communicator& control,
                                                 Stream& compute, DdpOptions options)
    : module_(module), comm_(gradients), control_(control), compute_(compute), options_(std::move(options)) {
  // Every kernel, the hooks' 16-bit packs included, runs on the device's compute stream (launch()
  // in core/launch.h); allreduce_after orders the bucket after `compute`, so they must be one.
  for (Parameter* p : module_.parameters())
    if (p->value.device().is_cuda())
      DTRAIN_CHECK(&compute == &compute_stream(p->value.device()),
                   "DDP's compute stream must be {}'s compute stream, where launch() runs kernels",
                   p->value.device().str());
  verify_same_model_on_all_ranks(module_, control);
  ReducerOptions ro{options_.first_bucket_bytes, options_.bucket_cap_bytes, options_.find_unused_parameters,
                    options_.zero_stage, options_.gradient_ring};
  reducer_ = std::make_unique<Reducer>(module_.parameters(), comm_, make_comm_hook(options_.comm_hook), ro, compute);
  // Rank 0's parameters: one broadcast of the flat store (the gaps between parameters are zero
  // on every rank), one per buffer.
  std::vector<WorkHandle> pending;
  order_after(compute_, comm_);  // the initialisation kernels wrote the parameters (comm/communicator.h)
  Tensor& values = reducer_->store().values();
  pending.push_back(comm_.broadcast_async(values.raw(), values.numel(), values.dtype(), 0));
  for (auto& w : pending) w->wait();
  broadcast_buffers(0);
  if (options_.zero_stage > 0) {
    reducer_->store().set_after_range([this](size_t k) { reducer_->updated_range(k); });
    reducer_->store().set_after_step([this] { reducer_->gather_updated_values(); });
  }
  module_.set_grad_ready_hook([this](Parameter& p) { reducer_->mark_ready(p); });
  if (options_.sync_batchnorm) convert_sync_batchnorm(module_, comm_, compute_);
}

DistributedDataParallel::~DistributedDataParallel() {
  module_.set_grad_ready_hook(nullptr);
  if (options_.sync_batchnorm) module_.set_batch_stats_sync(nullptr);
  if (options_.zero_stage > 0) {
    reducer_->store().set_after_range(nullptr);
    reducer_->store().set_after_step(nullptr);
  }
}

// Note [Buffer broadcast]: PyTorch's DDP (broadcast_buffers=True) broadcasts the module's buffers
// from rank 0 before a forward that follows a synced forward: once per optimizer step, at its
// first micro-batch (a forward under no_sync() leaves the next one without the broadcast). So
// every replica normalises with rank 0's running statistics, and the statistics a checkpoint
// saves are rank 0's. Under Join, rank 0 may have run out of data and hold stale statistics:
// the source is then the highest rank that still has data (DDP's _find_common_rank), set by
// set_buffer_source each step, and a joined rank takes part through join_forward(). One
// broadcast per buffer, on the gradient communicator after the compute stream (the previous
// step's kernels wrote them); --broadcast-buffers off skips it and each rank keeps its own.
Tensor DistributedDataParallel::forward(const Tensor& input) {
  if (buffers_due_ && options_.broadcast_buffers) broadcast_buffers(buffer_source_);
  buffers_due_ = sync_;
  return module_.forward(input);
}

void DistributedDataParallel::join_forward() {
  if (buffers_due_ && options_.broadcast_buffers) broadcast_buffers(buffer_source_);
  buffers_due_ = true;
}

void DistributedDataParallel::broadcast_buffers(int source) {
  std::vector<Buffer*> buffers = module_.buffers();
  if (buffers.empty()) return;
  order_after(compute_, comm_);
  std::vector<WorkHandle> pending;
  for (Buffer* b : buffers)
    pending.push_back(comm_.broadcast_async(b->value.raw(), b->value.numel(), b->value.dtype(), source));
  for (auto& w : pending) w->wait();
}

void DistributedDataParallel::backward(const Tensor& grad_output) {
  const int64_t start = steady_now_ns();
  reducer_->prepare_for_backward(sync_);
  // Note [Averaging folded into backward] (ddp/comm_hook.h).
  ensure_tensor(scaled_grad_output_, grad_output.shape(), grad_output.device());
  scaled_grad_output_.copy_from(grad_output);
  scale(scaled_grad_output_, 1.f / static_cast<float>(comm_.size()));
  try {
    module_.backward(scaled_grad_output_, false);
  } catch (...) {
    reducer_->abort_backward();  // no all-reduce may outlive the buffers it writes
    throw;
  }
  const int64_t end = steady_now_ns();
  reducer_->finalize_backward();
  if (!sync_) return;
  // A trial step's cost includes the all-reduces, which on a GPU finish after wait() returns.
  if (tuner_) compute_.synchronize();
  timing_ = {start, end, steady_now_ns(), reducer_->last_timings()};
  read_device_times();
  after_synced_backward(timing_.synced_ns - timing_.start_ns);
}

void DistributedDataParallel::join_backward() {
  DTRAIN_CHECK(sync_, "join_backward inside no_sync: a joined rank has nothing to accumulate");
  const int64_t start = steady_now_ns();
  reducer_->prepare_for_backward(true);
  reducer_->zero_and_mark_all_ready();
  reducer_->finalize_backward();
  if (tuner_) compute_.synchronize();
  timing_ = {start, start, steady_now_ns(), reducer_->last_timings()};
  read_device_times();
  after_synced_backward(timing_.synced_ns - timing_.start_ns);
}

void DistributedDataParallel::read_device_times() {
  for (BucketTiming& b : timing_.buckets) {
    WorkHandle work = std::exchange(b.device_work, nullptr);
    if (!work || !options_.device_timing) continue;
    work->wait_for_device_times();
    b.started_ns = work->started_ns();
    b.finished_ns = work->finished_ns();
  }
}

void DistributedDataParallel::use_layout(const BucketLayout& layout) {
  if (layout == reducer_->layout()) return;
  compute_.synchronize();  // the gradients it copies are written, and no kernel reads the old places
  reducer_->apply_layout(layout);
}

void DistributedDataParallel::set_bucket_layout(const BucketLayout& layout) {
  use_layout(layout);
  order_agreed_ = layout_final_ = true;
  tuner_.reset();
}

void DistributedDataParallel::after_synced_backward(int64_t backward_ns) {
  ++synced_steps_;
  if (layout_final_) return;
  if (!order_agreed_) {
    // Note [Rebuilding buckets]: rank 0's order, so every rank builds the same buckets.
    order_agreed_ = true;
    BucketLayout layout = reducer_->layout();
    if (options_.rebuild_buckets && !options_.find_unused_parameters) {
      std::vector<size_t> order = broadcast_values(control_, reducer_->observed_order(), 0);
      if (!order.empty()) layout.ready_order = std::move(order);  // empty: rank 0 saw an unused parameter
    }
    if (layout.ready_order != reducer_->layout().ready_order)
      notes_.push_back(options_.bucket_cap_auto
                           ? std::string("buckets: rebuilt after step 1 in the order rank 0's gradients became ready; "
                                         "the bucket caps are tried in it")
                           : fmt::format("buckets: rebuilt after step 1 in the order rank 0's gradients became ready: {}",
                                         reducer_->describe(layout)));
    if (!options_.bucket_cap_auto) {
      use_layout(layout);
      layout_final_ = true;
      return;
    }
    // Note [Bucket cap autotuning]: each distinct plan once.
    std::vector<BucketCaps> distinct;
    std::vector<std::vector<std::vector<size_t>>> plans;
    for (const BucketCaps& c : options_.autotune_candidates) {
      auto plan = reducer_->plan_for({layout.ready_order, c.first_bucket_bytes, c.bucket_cap_bytes});
      if (std::find(plans.begin(), plans.end(), plan) != plans.end()) continue;
      plans.push_back(std::move(plan));
      distinct.push_back(c);
    }
    tuner_.emplace(std::move(distinct), options_.autotune_warmup_steps, options_.autotune_measured_steps);
    const BucketCaps& first = tuner_->candidates().front();
    use_layout({layout.ready_order, first.first_bucket_bytes, first.bucket_cap_bytes});
    if (tuner_->candidates().size() == 1) finish_tuning();
    return;
  }
  double ms = static_cast<double>(backward_ns) / 1e6;
  if (options_.autotune_step_ms) ms = options_.autotune_step_ms(tuner_->current(), ms);
  if (!tuner_->record(ms)) return;
  if (tuner_->finished()) return finish_tuning();
  const BucketCaps& next = tuner_->candidates()[tuner_->current()];
  use_layout({reducer_->layout().ready_order, next.first_bucket_bytes, next.bucket_cap_bytes});
}

void DistributedDataParallel::finish_tuning() {
  const std::vector<BucketCaps>& candidates = tuner_->candidates();
  size_t pick = 0;
  std::string tried = "one distinct plan, nothing to try";
  if (candidates.size() > 1) {
    // Every rank's medians, so every rank picks the same candidate from the same figures.
    const std::vector<std::vector<double>> all = allgather_vectors(control_, tuner_->medians());
    pick = choose_fastest_candidate(all);
    const std::vector<double> slowest = slowest_rank_ms(all);
    std::vector<std::string> parts;
    for (size_t c = 0; c < candidates.size(); ++c)
      parts.push_back(fmt::format("{:g}/{:g} MiB {:.3f} ms", mib(candidates[c].first_bucket_bytes),
                                  mib(candidates[c].bucket_cap_bytes), slowest[c]));
    tried = fmt::format("synced backward (median, slowest rank) with first bucket/cap {}", fmt::join(parts, ", "));
  }
  const BucketCaps& best = candidates[pick];
  const BucketLayout layout{reducer_->layout().ready_order, best.first_bucket_bytes, best.bucket_cap_bytes};
  use_layout(layout);
  layout_final_ = true;
  notes_.push_back(fmt::format("buckets: --bucket-cap-mb auto chose a {:g} MiB first bucket and a {:g} MiB cap after "
                               "step {} ({}): {}",
                               mib(best.first_bucket_bytes), mib(best.bucket_cap_bytes), synced_steps_, tried,
                               reducer_->describe(layout)));
  tuner_.reset();
}

}  // namespace dtrain
