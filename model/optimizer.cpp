#include "model/optimizer.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>

#include <fmt/format.h>

#include "core/error.h"
#include "core/named_enum.h"
#include "model/kernels.h"
#include "model/lr_schedule.h"

namespace dtrain {

Optimizer::Optimizer(std::vector<Parameter*> params, float lr) : params_(std::move(params)), lr_(lr) {
  if (params_.empty()) return;  // (a test's optimizer that only holds a state)
  store_ = FlatStore::of(params_);
  listener_ = store_->add_listener([this](const FlatStore::Relayout& change) { relayout(change); });
}

Optimizer::~Optimizer() {
  if (store_) store_->remove_listener(listener_);
}

void Optimizer::zero_grad() {
  for (Parameter* p : params_) p->grad_is_zero = true;
}

void Optimizer::place_pieces() {
  pieces_.assign(params_.size(), Piece{});
  int64_t at = 0;
  for (const FlatRange& r : store_->owned()) {
    for (size_t i = 0; i < params_.size(); ++i) {
      const int64_t off = store_->offset(i), n = params_[i]->value.numel();
      const int64_t b = std::max(r.begin, off), e = std::min(r.end, off + n);
      if (b >= e) continue;
      DTRAIN_CHECK(pieces_[i].count == 0, "parameter {} is in two owned ranges", params_[i]->name);
      pieces_[i] = {b - off, e - b, at + (b - r.begin)};
    }
    at += r.size();
  }
  state_size_ = at;
  order_ = flat_order(*store_);
}

void Optimizer::init_state() {
  if (!store_) return;
  place_pieces();
  for (Tensor* a : state_arrays()) *a = Tensor::zeros({std::max<int64_t>(state_size_, 1)}, store_->device());
}

// Each parameter's state moves from its old piece to its new one; a part it newly owns starts at
// zero, which is right only while it has no state: under ZeRO the store's re-cut brings the
// other ranks' parts (Note [Re-cutting sharded state] in model/flat_store.h); without one, a
// part that moves between ranks after the first update is refused.
void Optimizer::relayout(const FlatStore::Relayout&) {
  const std::vector<Piece> old = pieces_;
  std::vector<Tensor*> arrays = state_arrays();
  place_pieces();
  if (store_->can_recut()) {
    // Every rank, every array, state or not (a collective: no rank may skip it).
    for (Tensor* a : arrays) *a = store_->recut(*a);
    return;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!has_state(i)) continue;
    const Piece& n = pieces_[i];
    const Piece& o = old[i];
    if (n.count > 0 && (n.param_offset < o.param_offset || n.param_offset + n.count > o.param_offset + o.count))
      throw Error(fmt::format("optimizer state of '{}' would move between ranks: the ZeRO shards cannot be re-cut after "
                              "the first optimizer step",
                              params_[i]->name));
  }
  const bool any_state = [&] {
    for (size_t i = 0; i < params_.size(); ++i)
      if (has_state(i)) return true;
    return false;
  }();
  for (Tensor* a : arrays) {
    if (!any_state) *a = Tensor();  // nothing to move (a rebuild before the first step): no peak of two
    Tensor fresh = Tensor::zeros({std::max<int64_t>(state_size_, 1)}, store_->device());
    for (size_t i = 0; i < params_.size(); ++i) {
      const Piece& n = pieces_[i];
      if (!has_state(i) || n.count == 0) continue;
      fresh.slice(n.state_offset, {n.count}).copy_from(a->slice(old[i].state_offset + (n.param_offset - old[i].param_offset), {n.count}));
    }
    *a = fresh;
  }
}

void Optimizer::step() {
  if (!store_) return;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!params_[i]->grad_is_zero) advance(i);
  int64_t at = 0;
  const std::function<std::optional<std::vector<int64_t>>(size_t)> key = [this](size_t i) { return run_key(i); };
  const std::vector<FlatRange>& owned = store_->owned();
  for (size_t k = 0; k < owned.size(); ++k) {
    const FlatRange& r = owned[k];
    for (const FlatRun& run : flat_runs(*store_, order_, r, key)) {
      update(run, at + (run.range.begin - r.begin), run.range.size());
      ++launches_;
    }
    at += r.size();
    store_->after_range(k);
  }
  finish_step();
  store_->after_step();
}

std::vector<Optimizer::OwnedPart> Optimizer::owned_parts() const {
  std::vector<OwnedPart> parts;
  for (size_t i = 0; i < pieces_.size(); ++i)
    if (pieces_[i].count > 0) parts.push_back({params_[i], pieces_[i].param_offset, pieces_[i].count});
  return parts;
}

size_t Optimizer::state_bytes() const {
  size_t n = 0;
  for (Tensor* a : const_cast<Optimizer*>(this)->state_arrays()) n += a->nbytes();
  return n;
}

Tensor Optimizer::state_view(const Tensor& array, size_t i) const {
  const Piece& piece = pieces_[i];
  if (piece.count == params_[i]->value.numel()) return array.slice(piece.state_offset, params_[i]->value.shape());
  return array.slice(piece.state_offset, {piece.count});
}

std::pair<size_t, std::string> Optimizer::parse_entry_name(const std::string& name,
                                                          const std::vector<const char*>& keys) const {
  const size_t dot = name.rfind('.');
  const std::string param = dot == std::string::npos ? "" : name.substr(0, dot);
  const std::string key = dot == std::string::npos ? name : name.substr(dot + 1);
  auto it = std::find_if(params_.begin(), params_.end(), [&](const Parameter* p) { return p->name == param; });
  if (it == params_.end()) throw Error(fmt::format("optimizer state: '{}' names no parameter of this model", name));
  if (std::none_of(keys.begin(), keys.end(), [&](const char* k) { return key == k; }))
    throw Error(fmt::format("optimizer state: '{}' is not state this {} optimizer keeps (it keeps {})", name, optimizer_name(kind()),
                            fmt::join(keys, ", ")));
  return {static_cast<size_t>(it - params_.begin()), key};
}

OptimizerState Optimizer::export_state() const {
  OptimizerState state;
  const std::vector<const char*> keys = tensor_keys();
  std::vector<Tensor*> arrays = const_cast<Optimizer*>(this)->state_arrays();
  for (size_t i = 0; i < params_.size(); ++i) {
    const Piece& piece = pieces_[i];
    if (!has_state(i) || piece.count == 0) continue;
    const bool whole = piece.count == params_[i]->value.numel();
    for (size_t k = 0; k < keys.size(); ++k) {
      OptimizerState::Entry e{params_[i]->name + "." + keys[k], state_view(*arrays[k], i)};
      if (!whole) {
        e.offset = piece.param_offset;
        e.full_shape = params_[i]->value.shape();
      }
      state.tensors.push_back(std::move(e));
    }
    if (count_key()) state.counts.push_back({params_[i]->name + "." + count_key(), count_of(i)});
  }
  return state;
}

void Optimizer::import_state(const OptimizerState& state) {
  const std::vector<const char*> keys = tensor_keys();
  std::vector<const char*> count_keys;
  if (count_key()) count_keys.push_back(count_key());
  if (!count_key() && !state.counts.empty())
    throw Error(fmt::format("optimizer state: '{}' is not state this {} optimizer keeps", state.counts[0].name,
                            optimizer_name(kind())));
  std::vector<Tensor*> arrays = state_arrays();
  if (arrays.empty() && !state.tensors.empty())
    throw Error(fmt::format("optimizer state: '{}' is a momentum buffer, and this SGD has no momentum", state.tensors[0].name));
  // Validated first: a rejected state leaves this optimizer unchanged.
  struct Copy {
    size_t entry, array;
    int64_t src, dst, count;
  };
  std::vector<Copy> copies;
  std::set<std::string> whole_seen;
  // Per parameter and key: the element ranges of the owned piece the entries cover.
  std::vector<std::vector<std::vector<std::pair<int64_t, int64_t>>>> covered(
      params_.size(), std::vector<std::vector<std::pair<int64_t, int64_t>>>(keys.size()));
  std::vector<int> present(params_.size(), 0);  // bits: one per key, then the count
  for (size_t k = 0; k < state.tensors.size(); ++k) {
    const OptimizerState::Entry& e = state.tensors[k];
    const auto [i, key] = parse_entry_name(e.name, keys);
    const size_t a = static_cast<size_t>(std::find_if(keys.begin(), keys.end(), [&](const char* s) { return key == s; }) - keys.begin());
    const Parameter& p = *params_[i];
    int64_t begin = 0;
    if (!e.is_slice()) {
      if (!whole_seen.insert(e.name).second) throw Error(fmt::format("optimizer state: '{}' appears twice", e.name));
      check_like(e.name, e.value, p.value);
    } else {
      if (e.full_shape != p.value.shape() || e.value.dtype() != DType::kF32 || e.offset < 0 ||
          e.offset + e.value.numel() > p.value.numel())
        throw Error(fmt::format("optimizer state: '{}' is a slice [{}, {}) of {} {}, the parameter is float32 {}", e.name,
                                e.offset, e.offset + e.value.numel(), dtype_name(e.value.dtype()), shape_str(e.full_shape),
                                shape_str(p.value.shape())));
      begin = e.offset;
    }
    present[i] |= 1 << a;
    const Piece& piece = pieces_[i];
    const int64_t b = std::max(begin, piece.param_offset), end = std::min(begin + e.value.numel(), piece.param_offset + piece.count);
    if (b >= end) continue;  // another rank's part
    covered[i][a].push_back({b, end});
    copies.push_back({k, a, b - begin, piece.state_offset + (b - piece.param_offset), end - b});
  }
  std::vector<int64_t> counts(params_.size(), 0);
  std::set<std::string> count_seen;
  for (const OptimizerState::Count& c : state.counts) {
    if (!count_seen.insert(c.name).second) throw Error(fmt::format("optimizer state: '{}' appears twice", c.name));
    const size_t i = parse_entry_name(c.name, count_keys).first;
    if (c.value < 1) throw Error(fmt::format("optimizer state: '{}' is {}, expected a step count >= 1", c.name, c.value));
    counts[i] = c.value;
    present[i] |= 1 << keys.size();
  }
  const int all = (1 << (keys.size() + (count_key() ? 1 : 0))) - 1;
  std::vector<bool> has(params_.size(), false);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (present[i] == 0) continue;
    if (present[i] != all) {
      size_t missing = 0;
      while (present[i] & (1 << missing)) ++missing;
      throw Error(fmt::format("optimizer state: '{}.{}' is missing (the parameter has other {} state)", params_[i]->name,
                              missing < keys.size() ? keys[missing] : count_key(),
                              kind() == OptimizerKind::kAdamW ? "AdamW" : "SGD"));
    }
    has[i] = true;
    const Piece& piece = pieces_[i];
    for (size_t a = 0; a < keys.size(); ++a) {
      auto& ranges = covered[i][a];
      std::sort(ranges.begin(), ranges.end());
      int64_t at = piece.param_offset;
      for (const auto& [b, e] : ranges) {
        if (b < at)
          throw Error(fmt::format("optimizer state: '{}.{}' has slices that overlap at element {}", params_[i]->name, keys[a], b));
        if (b > at) break;
        at = e;
      }
      if (at != piece.param_offset + piece.count)
        throw Error(fmt::format("optimizer state: '{}.{}' does not cover elements [{}, {}) of the part this rank updates",
                                params_[i]->name, keys[a], at, piece.param_offset + piece.count));
    }
  }
  for (Tensor* a : arrays) a->zero_();
  reset_state(counts, has);
  for (const Copy& c : copies) {
    const Tensor& src = state.tensors[c.entry].value;
    arrays[c.array]->slice(c.dst, {c.count}).copy_from(src.view({src.numel()}).slice(c.src, {c.count}));
  }
}

void Optimizer::check_like(const std::string& name, const Tensor& src, const Tensor& dst) {
  if (src.shape() != dst.shape() || src.dtype() != dst.dtype())
    throw Error(fmt::format("optimizer state: '{}' is {} {}, the parameter needs {} {}", name, dtype_name(src.dtype()),
                            shape_str(src.shape()), dtype_name(dst.dtype()), shape_str(dst.shape())));
}

Sgd::Sgd(std::vector<Parameter*> params, SgdOptions options) : Optimizer(std::move(params), options.lr), opt_(options) {
  DTRAIN_CHECK(!opt_.nesterov || (opt_.momentum > 0.f && opt_.dampening == 0.f),
               "Nesterov momentum needs momentum > 0 and dampening 0");
  stepped_.assign(params_.size(), false);
  init_state();
}

std::vector<const char*> Sgd::tensor_keys() const {
  if (opt_.momentum == 0.f) return {};
  return {"momentum_buffer"};
}

std::vector<Tensor*> Sgd::state_arrays() {
  if (opt_.momentum == 0.f) return {};
  return {&momentum_};
}

std::optional<std::vector<int64_t>> Sgd::run_key(size_t i) const {
  if (params_[i]->grad_is_zero) return std::nullopt;
  return std::vector<int64_t>{decays(i, opt_.decay_matrices_only), stepped_[i]};
}

void Sgd::update(const FlatRun& run, int64_t state_offset, int64_t n) {
  const size_t i = run.first_param;
  float* buf = momentum_.defined() ? momentum_.data() + state_offset : nullptr;
  const bool first = !stepped_[i];
  const bool decay = decays(i, opt_.decay_matrices_only);
  launch(store_->device(), n,
         kernels::SgdUpdate{store_->values().data() + run.range.begin, store_->grad_at(run.range.begin, state_offset), buf, lr_,
                            decay ? opt_.weight_decay : 0.f, first ? 0.f : opt_.momentum, first ? 1.f : 1.f - opt_.dampening,
                            opt_.nesterov ? 1.f : 0.f, opt_.nesterov ? opt_.momentum : 1.f});
}

void Sgd::finish_step() {
  for (size_t i = 0; i < params_.size(); ++i)
    if (!params_[i]->grad_is_zero) stepped_[i] = true;
}

void Sgd::reset_state(const std::vector<int64_t>&, const std::vector<bool>& present) {
  stepped_ = present;  // a buffer exists: the next update uses momentum
}

AdamW::AdamW(std::vector<Parameter*> params, AdamWOptions options)
    : Optimizer(std::move(params), options.lr), opt_(options) {
  steps_.assign(params_.size(), 0);
  init_state();
}

std::optional<std::vector<int64_t>> AdamW::run_key(size_t i) const {
  if (params_[i]->grad_is_zero) return std::nullopt;
  return std::vector<int64_t>{decays(i, opt_.decay_matrices_only), steps_[i]};
}

void AdamW::update(const FlatRun& run, int64_t state_offset, int64_t n) {
  const size_t i = run.first_param;
  const double t = static_cast<double>(steps_[i]);
  const double lr = decimal_as_written(lr_), beta1 = decimal_as_written(opt_.beta1), beta2 = decimal_as_written(opt_.beta2);
  const double bias_correction1 = 1 - std::pow(beta1, t), bias_correction2 = 1 - std::pow(beta2, t);
  const double weight_decay = decays(i, opt_.decay_matrices_only) ? decimal_as_written(opt_.weight_decay) : 0.0;
  launch(store_->device(), n,
         kernels::AdamWUpdate{store_->values().data() + run.range.begin, store_->grad_at(run.range.begin, state_offset),
                              m_.data() + state_offset, v_.data() + state_offset, static_cast<float>(1 - lr * weight_decay),
                              opt_.beta1, opt_.beta2, static_cast<float>(1 - beta1), static_cast<float>(1 - beta2),
                              static_cast<float>(std::sqrt(bias_correction2)), opt_.eps,
                              static_cast<float>(-lr / bias_correction1)});
}

void AdamW::reset_state(const std::vector<int64_t>& counts, const std::vector<bool>&) { steps_ = counts; }

namespace {
constexpr auto kOptimizers =
    enum_names<OptimizerKind>(std::pair{OptimizerKind::kSgd, "sgd"}, std::pair{OptimizerKind::kAdamW, "adamw"});
}  // namespace

const char* optimizer_name(OptimizerKind kind) { return kOptimizers.name(kind); }
std::optional<OptimizerKind> parse_optimizer_kind(const std::string& name) { return kOptimizers.parse(name); }

std::unique_ptr<Optimizer> make_optimizer(const OptimizerSpec& spec, std::vector<Parameter*> params) {
  if (spec.kind == OptimizerKind::kAdamW) {
    AdamWOptions o;
    o.lr = spec.lr;
    o.weight_decay = spec.weight_decay;
    o.eps = spec.eps;
    o.beta2 = spec.beta2;
    o.decay_matrices_only = spec.decay_matrices_only;
    return std::make_unique<AdamW>(std::move(params), o);
  }
  return std::make_unique<Sgd>(std::move(params), SgdOptions{spec.lr, spec.momentum, 0.f, spec.weight_decay, spec.nesterov,
                                                                  spec.decay_matrices_only});
}

}  // namespace dtrain

