#include "ddp/reducer.h"

#include "comm/flight_recorder.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"
#include "core/host_allocator.h"

namespace dtrain {

namespace {
constexpr int64_t kBucketAlignFloats = 16;  // 64 bytes: a cache line, and what vector loads like
constexpr size_t kRingSlots = 2;            // Note [ZeRO-2 gradient ring]: one written, one reduced

std::vector<int64_t> numel_of(const std::vector<Parameter*>& params) {
  std::vector<int64_t> numel(params.size());
  for (size_t p = 0; p < params.size(); ++p) numel[p] = params[p]->value.numel();
  return numel;
}
}  // namespace

Reducer::Reducer(std::vector<Parameter*> params, Communicator& comm, std::unique_ptr<CommHook> hook,
                 ReducerOptions options, Stream& compute)
    : params_(std::move(params)), comm_(comm), hook_(std::move(hook)), options_(options), compute_(compute) {
  DTRAIN_CHECK(!params_.empty(), "DistributedDataParallel needs a module with parameters");
  const Device device = params_.front()->value.device();

  int64_t total = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    DTRAIN_CHECK(params_[i]->value.device() == device, "parameter {} is on {}, the first on {}", params_[i]->name,
                 params_[i]->value.device().str(), device.str());
    index_of_[params_[i]] = i;
    param_bytes_.push_back(params_[i]->value.nbytes());
    total += params_[i]->value.numel();
  }
  bucket_of_.resize(params_.size());
  param_offset_.resize(params_.size());
  ready_.assign(params_.size(), false);
  used_since_sync_.assign(params_.size(), false);

  DTRAIN_CHECK(options_.zero_stage >= 0 && options_.zero_stage <= 2, "ZeRO stage {}", options_.zero_stage);
  // Gradients become views into the bucket buffers (their current values are kept), so the
  // all-reduce reads and writes them in place: no copy in, no copy out. The communicator
  // allocates the storage (on one node, MPI's comes from a shared window its all-reduce reads),
  // with room to start every bucket on a 64-byte boundary, padded for ZeRO, whatever the layout.
  const int64_t pad = kBucketAlignFloats + (options_.zero_stage > 0 ? comm_.size() : 0);
  ring_ = options_.zero_stage == 2 && comm_.size() > 1 && options_.gradient_ring != GradientRing::kWhole;
  if (ring_ && options_.gradient_ring == GradientRing::kAuto) {
    // Note [ZeRO-2 gradient ring]: only where the slots and the owned chunks hold less.
    const FlatLayout flat = lay_out_buckets(plan_for({reverse_parameter_order(params_.size()),
                                                      options_.first_bucket_bytes, options_.bucket_cap_bytes}),
                                            numel_of(params_), comm_.size());
    const int64_t largest = *std::max_element(flat.bucket_size.begin(), flat.bucket_size.end());
    ring_ = static_cast<int64_t>(kRingSlots) * largest + flat.total / comm_.size() < total;
  }
  if (!ring_)
    storage_ = comm_.allocate_reduce_buffer(total + pad * static_cast<int64_t>(params_.size()), DType::kF32, device);
  // ZeRO's all-gather of the updated values reads and writes them where they lie, as the
  // all-reduce does the gradients (on one node: pushed into every rank's copy of the window, no
  // staging copy in or out).
  if (options_.zero_stage > 0 && comm_.size() > 1)
    value_storage_ = comm_.allocate_reduce_buffer(total + pad * static_cast<int64_t>(params_.size()), DType::kF32, device);
  store_ = FlatStore::of(params_, /*lay_out_now=*/false);  // apply_layout lays it out
  store_->set_grads_sharded(options_.zero_stage == 2 && comm_.size() > 1);
  if (ring_) {
    store_->lend_grads(Tensor(), 0);
    for (size_t i = 0; i < params_.size(); ++i)
      params_[i]->before_grad_write = [this, i](Parameter&) {
        if (in_backward_) borrow_slot(bucket_of_[i]);
      };
  }
  apply_layout({reverse_parameter_order(params_.size()), options_.first_bucket_bytes, options_.bucket_cap_bytes});
}

std::vector<std::vector<size_t>> Reducer::plan_for(const BucketLayout& layout) const {
  return compute_bucket_plan(param_bytes_, layout.ready_order, layout.first_bucket_bytes, layout.bucket_cap_bytes);
}

std::string Reducer::describe(const BucketLayout& layout) const { return describe_plan(plan_for(layout), param_bytes_); }

void Reducer::apply_layout(const BucketLayout& layout) {
  DTRAIN_CHECK(!in_backward_, "buckets rebuilt during a backward");
  const std::string wrong = check_ready_order(layout.ready_order, params_.size());
  if (!wrong.empty()) throw Error(fmt::format("bucket layout does not fit this model: {}", wrong));
  for (const GradBucket& b : buckets_) DTRAIN_CHECK(!b.work, "buckets rebuilt while bucket {} is in flight", b.index);
  // Every gradient keeps its value (a rebuild comes between a backward and its optimizer step):
  // the store moves them, the values and the optimizer state (Note [Flat store]). Under ZeRO-2
  // only this rank's chunks hold reduced gradients: gather the others' first.
  if (options_.zero_stage == 2 && !ring_ && !buckets_.empty()) {
    order_after(compute_, comm_);
    for (GradBucket& b : buckets_)
      comm_.allgather_async(b.buffer.data() + comm_.rank() * b.shard_elements, b.buffer.data(), b.shard_elements,
                            DType::kF32)
          ->wait();
  }
  const std::vector<std::vector<size_t>> plan = plan_for(layout);
  const std::vector<int64_t> numel = numel_of(params_);
  const int world = options_.zero_stage > 0 ? comm_.size() : 1;
  const int rank = options_.zero_stage > 0 ? comm_.rank() : 0;
  const FlatLayout flat = lay_out_buckets(plan, numel, world);
  std::vector<ZeroChunk> chunks = zero_chunks(flat, plan, numel, world, rank);
  std::vector<FlatRange> owned;
  std::vector<int64_t> chunk_at;
  int64_t owned_size = 0;
  for (const ZeroChunk& c : chunks) {
    chunk_at.push_back(owned_size);
    owned_size += c.range.size();
    if (options_.zero_stage > 0 && c.range.size() > 0) owned.push_back(c.range);
  }
  if (owned.empty()) owned.push_back({0, 0});  // owns nothing (never with N <= elements of a bucket)
  // Note [Re-cutting sharded state]: the old layout's shards and the new one's.
  const bool resharding = options_.zero_stage > 0 && comm_.size() > 1 && !buckets_.empty();
  ShardCut from, to{flat, plan, chunks, chunk_at, owned_size};
  if (resharding) {
    from = {flat_, {}, chunks_, chunk_at_, 0};
    for (const GradBucket& b : buckets_) from.plan.push_back(b.params);
  }
  if (ring_) {
    // Before the old layout is gone.
    Tensor owned_grads = resharding ? recut(owned_grads_, from, to)
                                    : Tensor::zeros({std::max<int64_t>(owned_size, 1)}, store_->device());
    const int64_t largest = *std::max_element(flat.bucket_size.begin(), flat.bucket_size.end());
    slot_floats_ = std::max<int64_t>(largest, 1);
    slots_.clear();
    for (size_t s = 0; s < kRingSlots; ++s) slots_.push_back(Tensor::zeros({slot_floats_}, store_->device()));
    slot_holder_.assign(slots_.size(), -1);
    slot_of_.assign(plan.size(), -1);
    owned_grads_ = owned_grads;
    store_->lend_grads(owned_grads_, static_cast<size_t>(slot_floats_) * sizeof(float) * kRingSlots);
  }
  for (const WorkHandle& w : gathers_) DTRAIN_CHECK(!w, "buckets rebuilt during the all-gather of the values");
  gathers_.assign(plan.size(), nullptr);
  owned_bucket_.clear();
  for (const ZeroChunk& c : chunks)
    if (c.range.size() > 0) owned_bucket_.push_back(c.bucket);
  chunks_ = std::move(chunks);
  chunk_at_ = std::move(chunk_at);
  // The optimizer's state moves with the shards, through the same re-cut as the gradients.
  if (resharding) store_->set_recut([&](const Tensor& old_compact) { return recut(old_compact, from, to); });
  try {
    store_->lay_out(flat.param_offset, flat.total, storage_, options_.zero_stage > 0 ? owned : std::vector<FlatRange>{},
                    value_storage_);
  } catch (...) {
    store_->set_recut(nullptr);
    throw;
  }
  store_->set_recut(nullptr);
  param_offset_ = flat.param_offset;
  buckets_.clear();
  for (size_t k = 0; k < plan.size(); ++k) {
    GradBucket b;
    b.index = k;
    b.params = plan[k];
    // Under the ring a placeholder until the bucket borrows its slot.
    b.buffer = ring_ ? slots_[0].slice(0, {flat.bucket_size[k]}) : storage_.slice(flat.bucket_begin[k], {flat.bucket_size[k]});
    if (options_.zero_stage == 2) b.shard_elements = flat.bucket_size[k] / comm_.size();
    if (ring_) b.shard_out = owned_grads_.data() + chunk_at_[k];
    for (size_t p : b.params) {
      bucket_of_[p] = k;
      // Until borrowed, the gradients alias slot 0 (the model's own gradient buffers are freed).
      if (ring_) params_[p]->grad = slots_[0].slice(flat.param_offset[p] - flat.bucket_begin[k], params_[p]->value.shape());
    }
    buckets_.push_back(std::move(b));
  }
  // The model's own gradient buffers, just dropped, would stay in the host allocator's cache.
  if (ring_ && store_->device().is_cpu()) HostAllocator::instance().release_cached();
  flat_ = flat;
  layout_ = layout;
  hook_->buckets_changed();
}

Reducer::~Reducer() {
  abort_backward();
  if (ring_)
    for (Parameter* p : params_) p->before_grad_write = nullptr;
}

Tensor Reducer::recut(const Tensor& compact, const ShardCut& from, const ShardCut& to) {
  Tensor fresh = Tensor::zeros({std::max<int64_t>(to.size, 1)}, store_->device());
  // Which new bucket holds each parameter.
  std::vector<size_t> new_bucket(params_.size());
  for (size_t k = 0; k < to.plan.size(); ++k)
    for (size_t p : to.plan[k]) new_bucket[p] = k;
  const int world = comm_.size();
  // One old bucket at a time (no rank holds more than its shard and one bucket): every rank's
  // chunk of it gathered, then the parts of it this rank's new chunks hold copied out.
  for (size_t b = 0; b < from.plan.size(); ++b) {
    const int64_t per_rank = from.flat.bucket_size[b] / world;
    Tensor whole = Tensor::empty({std::max<int64_t>(per_rank * world, 1)}, store_->device());  // the all-gather fills it
    order_after(compute_, comm_);  // the compute stream wrote `compact` (the optimizer, clipping, unscaling)
    ScopedCollectiveDetail detail(fmt::format("re-cut of bucket {}", b));
    comm_.allgather_async(compact.data() + from.chunk_at[b], whole.data(), per_rank, DType::kF32)->wait();
    for (size_t p : from.plan[b]) {
      const ZeroChunk& c = to.chunks[new_bucket[p]];
      for (const ZeroPiece& piece : c.pieces) {
        if (piece.param != p) continue;
        const int64_t src = from.flat.param_offset[p] - from.flat.bucket_begin[b] + piece.param_offset;
        const int64_t dst = to.chunk_at[new_bucket[p]] + (piece.flat_offset - c.range.begin);
        fresh.slice(dst, {piece.count}).copy_from(whole.slice(src, {piece.count}));
      }
    }
  }
  return fresh;
}

void Reducer::borrow_slot(size_t k) {
  if (!sync_ || slot_of_[k] >= 0) return;
  int slot = -1;
  for (size_t s = 0; s < slots_.size() && slot < 0; ++s)
    if (slot_holder_[s] < 0) slot = static_cast<int>(s);
  if (slot < 0) {
    // The oldest launched bucket holding a slot gives it back once its reduce-scatter is done.
    for (size_t s = 0; s < slots_.size(); ++s) {
      const int h = slot_holder_[s];
      if (static_cast<size_t>(h) < next_to_launch_ && (slot < 0 || h < slot_holder_[static_cast<size_t>(slot)]))
        slot = static_cast<int>(s);
    }
    if (slot >= 0) {
      const size_t h = static_cast<size_t>(slot_holder_[static_cast<size_t>(slot)]);
      buckets_[h].work->wait();  // finalize_backward waits again (a no-op) and records its times
      slot_of_[h] = -1;
    }
  }
  if (slot < 0) {  // every slot held by a bucket not yet launched: one more
    slots_.push_back(Tensor::zeros({slot_floats_}, store_->device()));
    slot_holder_.push_back(-1);
    slot = static_cast<int>(slots_.size() - 1);
    store_->lend_grads(owned_grads_, static_cast<size_t>(slot_floats_) * sizeof(float) * slots_.size());
  }
  const size_t s = static_cast<size_t>(slot);
  slot_holder_[s] = static_cast<int>(k);
  slot_of_[k] = slot;
  GradBucket& b = buckets_[k];
  const int64_t begin = flat_.bucket_begin[k], size = flat_.bucket_size[k];
  // A borrowed slot holds another bucket's gradients: a gradient to be added to (not zeroed since
  // the last step: two backwards with no zero_grad) has nothing of its own there to add to.
  for (size_t p : b.params)
    DTRAIN_CHECK(params_[p]->grad_is_zero,
                 "ZeRO-2's gradient ring cannot accumulate {} over two backwards without zero_grad: use "
                 "GradientRing::kWhole (the CLI's --accumulate does)",
                 params_[p]->name);
  b.buffer = slots_[s].slice(0, {size});
  int64_t used = 0;
  for (size_t p : b.params) {
    params_[p]->grad = slots_[s].slice(flat_.param_offset[p] - begin, params_[p]->value.shape());
    used += params_[p]->value.numel();
  }
  // The padding is reduced with the bucket: zero, not the previous bucket's gradients.
  if (used < size) b.buffer.slice(used, {size - used}).zero_();
}

void Reducer::return_slots() {
  std::fill(slot_holder_.begin(), slot_holder_.end(), -1);
  std::fill(slot_of_.begin(), slot_of_.end(), -1);
}

void Reducer::gather_bucket_values(size_t k) {
  if (options_.zero_stage == 0 || comm_.size() == 1 || gathers_[k]) return;
  // The optimizer's kernels wrote the chunk on the compute stream.
  order_after(compute_, comm_);
  const int64_t per_rank = flat_.bucket_size[k] / comm_.size();
  float* bucket = store_->values().data() + flat_.bucket_begin[k];
  ScopedCollectiveDetail detail(fmt::format("parameters of bucket {}", k));
  gathers_[k] = comm_.allgather_async(bucket + comm_.rank() * per_rank, bucket, per_rank, DType::kF32);
}

void Reducer::updated_range(size_t k) {
  if (k < owned_bucket_.size()) gather_bucket_values(owned_bucket_[k]);
}

void Reducer::gather_updated_values() {
  if (options_.zero_stage == 0 || comm_.size() == 1) return;
  // Those the optimizer did not report range by range (every rank's optimizer reports the same).
  for (size_t k = 0; k < buckets_.size(); ++k) gather_bucket_values(k);
  for (WorkHandle& w : gathers_) std::exchange(w, nullptr)->wait();
}

void Reducer::abort_backward() noexcept {
  in_backward_ = false;
  for (WorkHandle& w : gathers_) {  // a step that failed half-way (none else is in flight here)
    if (!w) continue;
    try {
      w->wait();
    } catch (...) {
    }
    w = nullptr;
  }
  for (GradBucket& b : buckets_) {
    if (!b.work) continue;
    try {
      b.work->wait();
    } catch (...) {
    }
    b.work = nullptr;
  }
  return_slots();
}

void Reducer::prepare_for_backward(bool sync) {
  if (ring_ && !sync)
    throw Error("no_sync under ZeRO-2 accumulates the whole local gradient: build DDP with GradientRing::kWhole "
                "(the trainer does for --accumulate > 1)");
  sync_ = sync;
  in_backward_ = true;
  std::fill(ready_.begin(), ready_.end(), false);
  for (GradBucket& b : buckets_) {
    DTRAIN_CHECK(!b.work, "backward started while bucket {} is still in flight", b.index);
    b.pending = b.params.size();
  }
  next_to_launch_ = 0;
  ready_order_.clear();
}

void Reducer::mark_ready(Parameter& param) {
  auto it = index_of_.find(&param);
  DTRAIN_CHECK(it != index_of_.end(), "gradient hook for '{}', which DDP does not manage", param.name);
  const size_t i = it->second;
  if (!in_backward_) return;  // a backward outside DDP's control (e.g. a test calling the module)
  if (ready_[i])
    throw Error(fmt::format("parameter '{}' produced its gradient twice in one backward; dtrain's DDP expects "
                            "each parameter to be used once per forward",
                            param.name));
  ready_[i] = true;
  used_since_sync_[i] = true;
  if (!sync_) return;
  ready_order_.push_back(i);
  if (ring_ && slot_of_[bucket_of_[i]] < 0)
    throw Error(fmt::format("parameter '{}' marked its gradient ready without writing it through take_grad_beta, "
                            "which ZeRO-2 needs to lend it memory (model/module.h)",
                            param.name));
  GradBucket& b = buckets_[bucket_of_[i]];
  if (--b.pending == 0) launch_ready_buckets();
}

std::vector<size_t> Reducer::observed_order() const {
  // Unused parameters (marked ready by finalize_backward, not by a hook) leave it incomplete.
  return ready_order_.size() == params_.size() ? ready_order_ : std::vector<size_t>{};
}

void Reducer::mark_all_ready() {
  for (Parameter* p : params_) mark_ready(*p);
  // Parameter order, not an observation: a joined rank has no order to rebuild buckets from.
  ready_order_.clear();
}

void Reducer::zero_and_mark_all_ready() {
  // Bucket by bucket, so each launches before the next borrows (Note [ZeRO-2 gradient ring]).
  for (size_t k = 0; k < buckets_.size(); ++k)
    for (size_t p : buckets_[k].params) {
      take_grad_beta(*params_[p]);  // (borrows the slot)
      params_[p]->grad.zero_();
      params_[p]->grad_is_zero = false;  // the all-reduce fills it: the optimizer must step with it
      mark_ready(*params_[p]);
    }
  ready_order_.clear();  // not an observation: a joined rank has no order to rebuild buckets from
}

void Reducer::launch_ready_buckets() {
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_].pending == 0) {
    launch(buckets_[next_to_launch_]);
    ++next_to_launch_;
    if (in_backward_) ++stats_.buckets_launched_during_backward;
  }
}

void Reducer::launch(GradBucket& bucket) {
  bucket.launched_ns = steady_now_ns();
  ScopedCollectiveDetail detail(fmt::format("bucket {}", bucket.index));  // the flight recorder's label
  bucket.work = hook_->run(bucket, comm_, compute_);  // Note [Stream ordering]
}

void Reducer::finalize_backward() {
  in_backward_ = false;
  if (!sync_) return;
  std::vector<std::string> missing;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    if (!options_.find_unused_parameters) {
      missing.push_back(params_[i]->name);
      continue;
    }
    // Unused in this step: its gradient is zero, unless no_sync steps accumulated one.
    if (ring_) borrow_slot(bucket_of_[i]);
    if (!used_since_sync_[i] || params_[i]->grad_is_zero) {
      params_[i]->grad.zero_();
      params_[i]->grad_is_zero = false;
    }
    ready_[i] = true;
    --buckets_[bucket_of_[i]].pending;
  }
  if (!missing.empty()) {
    abort_backward();  // launched buckets finish before we report: no collective left dangling
    throw Error(fmt::format("parameter(s) {} received no gradient in this backward; enable "
                            "find_unused_parameters if some parameters do not take part in every step",
                            fmt::join(missing, ", ")));
  }
  const int64_t before = next_to_launch_;
  launch_ready_buckets();
  stats_.buckets_launched_in_finalize += static_cast<int64_t>(next_to_launch_) - before;
  DTRAIN_CHECK(next_to_launch_ == buckets_.size(), "only {} of {} buckets launched", next_to_launch_, buckets_.size());
  timings_.clear();
  for (GradBucket& b : buckets_) {
    WorkHandle work = b.work;
    try {
      work->wait();
    } catch (...) {
      abort_backward();  // the later buckets are still in flight
      throw;
    }
    b.work = nullptr;
    const int64_t start = work->started_ns() ? work->started_ns() : b.launched_ns;
    const int64_t end = work->finished_ns() ? work->finished_ns() : steady_now_ns();
    timings_.push_back({b.index, b.buffer.nbytes(), b.launched_ns, start, end, work->device_timed() ? work : nullptr});
  }
  std::fill(used_since_sync_.begin(), used_since_sync_.end(), false);
  return_slots();
  ++stats_.synced_backwards;
}

}  // namespace dtrain
