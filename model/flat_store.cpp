#include "model/flat_store.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/host_allocator.h"

namespace dtrain {

namespace {
constexpr int64_t kAlignFloats = 16;  // 64 bytes: a cache line, and what vector loads like
int64_t align_up(int64_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }
}  // namespace

std::vector<int64_t> default_flat_offsets(const std::vector<Parameter*>& params, int64_t* size) {
  std::vector<int64_t> offsets(params.size());
  int64_t at = 0;
  for (size_t k = params.size(); k-- > 0;) {
    offsets[k] = at;
    at = align_up(at + params[k]->value.numel());
  }
  *size = at;
  return offsets;
}

std::vector<size_t> flat_order(const FlatStore& store) {
  std::vector<size_t> order(store.params().size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return store.offset(a) < store.offset(b); });
  return order;
}

std::shared_ptr<FlatStore> FlatStore::of(const std::vector<Parameter*>& params, bool lay_out_now) {
  DTRAIN_CHECK(!params.empty(), "a flat store needs parameters");
  std::shared_ptr<FlatStore> existing = params.front()->store;
  if (existing && existing->params_ == params) return existing;
  // A parameter of another store (DDP's, another optimizer's) would silently move: its old
  // store's gradient buckets and all-gathers would no longer see it, and ranks drift apart.
  for (Parameter* p : params)
    if (p->store)
      throw Error(fmt::format("parameter '{}' already belongs to a flat store of {} parameter(s) (DDP's or another "
                              "optimizer's): build the optimizer over that same parameter list",
                              p->name, p->store->params_.size()));
  std::shared_ptr<FlatStore> store(new FlatStore(params, lay_out_now));
  for (Parameter* p : params) p->store = store;
  return store;
}

FlatStore::FlatStore(std::vector<Parameter*> params, bool lay_out_now)
    : params_(std::move(params)), device_(params_.front()->value.device()) {
  for (Parameter* p : params_) {
    DTRAIN_CHECK(p->value.device() == device_, "parameter {} is on {}, the first on {}", p->name, p->value.device().str(),
                 device_.str());
    DTRAIN_CHECK(p->value.dtype() == DType::kF32, "parameter {} is {}: the flat store holds float32", p->name,
                 dtype_name(p->value.dtype()));
  }
  if (!lay_out_now) return;
  int64_t size = 0;
  std::vector<int64_t> offsets = default_flat_offsets(params_, &size);
  lay_out(std::move(offsets), size);
}

void FlatStore::lay_out(std::vector<int64_t> offsets, int64_t size, Tensor grad_storage, std::vector<FlatRange> owned,
                        Tensor value_storage) {
  DTRAIN_CHECK(offsets.size() == params_.size(), "{} offsets for {} parameters", offsets.size(), params_.size());
  for (size_t i = 0; i < params_.size(); ++i)
    DTRAIN_CHECK(offsets[i] >= 0 && offsets[i] + params_[i]->value.numel() <= size, "parameter {} at {} outside {} elements",
                 params_[i]->name, offsets[i], size);
  if (owned.empty()) owned = {{0, size}};
  if (grads_lent_) grad_storage = Tensor();  // no flat gradient: nothing moves
  // Values: a new buffer (zero between parameters), each value copied in; a given one may be
  // where they are now: copy them out first. Gradients: through a copy of the old ones likewise.
  Tensor values = value_storage.defined() ? value_storage : Tensor::zeros({size}, device_);
  if (value_storage.defined()) {
    DTRAIN_CHECK(value_storage.numel() >= size && value_storage.dtype() == DType::kF32,
                 "value storage of {} elements for {}", value_storage.numel(), size);
    if (values_.defined() && value_storage.shares_storage(values_)) {
      Tensor old_values = Tensor::empty(values_.shape(), device_);
      old_values.copy_from(values_);
      for (size_t i = 0; i < params_.size(); ++i)
        params_[i]->value = old_values.slice(offsets_[i], params_[i]->value.shape());
    }
    values.zero_();
  }
  // Only a gradient buffer that is reused needs the copy (a peak of one more buffer otherwise).
  Tensor old_grads;
  if (!grads_lent_ && grads_.defined() && grad_storage.defined() && grad_storage.shares_storage(grads_)) {
    old_grads = Tensor::empty(grads_.shape(), device_);
    old_grads.copy_from(grads_);
  }
  if (grads_lent_) {
    // The owner of the lent gradients moves them (ddp/reducer.h).
  } else if (grad_storage.defined()) {
    DTRAIN_CHECK(grad_storage.numel() >= size && grad_storage.dtype() == DType::kF32, "gradient storage of {} elements for {}",
                 grad_storage.numel(), size);
    grad_storage.zero_();
  } else {
    grad_storage = Tensor::zeros({size}, device_);
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    Tensor value = values.slice(offsets[i], p.value.shape());
    value.copy_from(p.value);
    p.value = value;
    if (grads_lent_) continue;
    Tensor grad = grad_storage.slice(offsets[i], p.value.shape());
    if (old_grads.defined())
      grad.copy_from(old_grads.slice(offsets_[i], p.value.shape()));
    else if (p.grad.defined())
      grad.copy_from(p.grad);
    p.grad = grad;
  }
  Relayout change{std::exchange(offsets_, std::move(offsets)), std::exchange(owned_, std::move(owned))};
  size_ = size;
  values_ = values;
  grads_ = grad_storage;
  old_grads = Tensor();
  ++version_;
  // The old buffers (the whole model's size, once or twice) would stay in the host allocator's
  // cache at their size classes, which nothing of another size reuses (ZeRO's smaller optimizer
  // state): a layout is rare, so give them back.
  if (device_.is_cpu()) HostAllocator::instance().release_cached();
  if (!change.old_offsets.empty())
    for (auto& [id, listener] : listeners_) listener(change);
}

void FlatStore::lend_grads(Tensor owned_grads, size_t lent_bytes) {
  grads_lent_ = true;
  grads_ = Tensor();
  owned_grads_ = std::move(owned_grads);
  lent_bytes_ = lent_bytes;
}

std::vector<GradSpan> FlatStore::owned_grad_spans() {
  if (grads_lent_) return {{owned_grads_.data(), owned_grads_.numel()}};
  std::vector<GradSpan> spans;
  for (const FlatRange& r : owned_)
    if (r.size() > 0) spans.push_back({grads_.data() + r.begin, r.size()});
  return spans;
}

int FlatStore::add_listener(Listener listener) {
  listeners_.emplace_back(next_listener_, std::move(listener));
  return next_listener_++;
}

void FlatStore::remove_listener(int id) {
  std::erase_if(listeners_, [&](const auto& l) { return l.first == id; });
}

}  // namespace dtrain
