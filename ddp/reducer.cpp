#include "ddp/reducer.h"

#include "comm/flight_recorder.h"

#include <utility>

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain {

namespace {
constexpr int64_t kBucketAlignFloats = 16;  // 64 bytes: a cache line, and what vector loads like
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

  // Gradients become views into the bucket buffers (their current values are kept), so the
  // all-reduce reads and writes them in place: no copy in, no copy out. The communicator
  // allocates the storage (on one node, MPI's comes from a shared window its all-reduce reads),
  // with room to start every bucket on a 64-byte boundary whatever the layout.
  storage_ = comm_.allocate_reduce_buffer(total + kBucketAlignFloats * static_cast<int64_t>(params_.size()),
                                          DType::kF32, device);
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
  // one temporary copy of the storage, read back at each gradient's old offset. At construction
  // the gradients are still tensors of their own and are copied from there.
  // On a GPU the copies are queued on the compute stream; `previous` may be freed before they
  // run because its memory is next used by work ordered after them on that same stream.
  Tensor previous;
  if (!buckets_.empty()) {
    previous = Tensor::empty(storage_.shape(), storage_.device());
    previous.copy_from(storage_);
  }
  std::vector<Tensor> saved(params_.size());
  for (size_t p = 0; p < params_.size(); ++p) {
    if (!buckets_.empty())
      saved[p] = previous.slice(param_offset_[p], params_[p]->value.shape());
    else if (params_[p]->grad.defined())
      saved[p] = params_[p]->grad;
  }
  buckets_.clear();
  int64_t offset = 0;
  for (auto& members : plan_for(layout)) {
    GradBucket b;
    b.index = buckets_.size();
    b.params = std::move(members);
    int64_t numel = 0;
    for (size_t p : b.params) numel += params_[p]->value.numel();
    b.buffer = storage_.slice(offset, {numel});
    int64_t at = 0;
    for (size_t p : b.params) {
      Parameter& param = *params_[p];
      Tensor view = b.buffer.slice(at, param.value.shape());
      param_offset_[p] = offset + at;
      at += param.value.numel();
      if (saved[p].defined()) view.copy_from(saved[p]);
      param.grad = view;
      bucket_of_[p] = b.index;
    }
    offset += (numel + kBucketAlignFloats - 1) / kBucketAlignFloats * kBucketAlignFloats;
    buckets_.push_back(std::move(b));
  }
  layout_ = layout;
  hook_->buckets_changed();
}

Reducer::~Reducer() { abort_backward(); }

void Reducer::abort_backward() noexcept {
  in_backward_ = false;
  for (GradBucket& b : buckets_) {
    if (!b.work) continue;
    try {
      b.work->wait();
    } catch (...) {
    }
    b.work = nullptr;
  }
}

void Reducer::prepare_for_backward(bool sync) {
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
  ++stats_.synced_backwards;
}

}  // namespace dtrain
