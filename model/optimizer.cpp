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

void Optimizer::zero_grad() {
  for (Parameter* p : params_) p->grad_is_zero = true;
}

std::pair<size_t, std::string> Optimizer::parse_entry_name(const std::string& name,
                                                          std::initializer_list<const char*> keys) const {
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

void Optimizer::check_like(const std::string& name, const Tensor& src, const Tensor& dst) {
  if (src.shape() != dst.shape() || src.dtype() != dst.dtype())
    throw Error(fmt::format("optimizer state: '{}' is {} {}, the parameter needs {} {}", name, dtype_name(src.dtype()),
                            shape_str(src.shape()), dtype_name(dst.dtype()), shape_str(dst.shape())));
}

namespace {

// Throws when an entry name repeats.
void check_unique(std::set<std::string>& seen, const std::string& name) {
  if (!seen.insert(name).second) throw Error(fmt::format("optimizer state: '{}' appears twice", name));
}

}  // namespace

Sgd::Sgd(std::vector<Parameter*> params, SgdOptions options) : Optimizer(std::move(params), options.lr), opt_(options) {
  DTRAIN_CHECK(!opt_.nesterov || (opt_.momentum > 0.f && opt_.dampening == 0.f),
               "Nesterov momentum needs momentum > 0 and dampening 0");
  if (opt_.momentum != 0.f)
    for (Parameter* p : params_) momentum_.push_back(Tensor::zeros(p->value.shape(), p->value.device()));
  stepped_.assign(params_.size(), false);
}

void Sgd::step() {
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    if (p.grad_is_zero) continue;
    float* buf = momentum_.empty() ? nullptr : momentum_[i].data();
    const bool first = !stepped_[i];
    const bool decays = !opt_.decay_matrices_only || p.value.shape().size() >= 2;
    launch(p.value.device(), p.value.numel(),
           kernels::SgdUpdate{p.value.data(), p.grad.data(), buf, lr_, decays ? opt_.weight_decay : 0.f, first ? 0.f : opt_.momentum,
                              first ? 1.f : 1.f - opt_.dampening, opt_.nesterov ? 1.f : 0.f,
                              opt_.nesterov ? opt_.momentum : 1.f});
    stepped_[i] = true;
  }
}

OptimizerState Sgd::export_state() const {
  OptimizerState state;
  for (size_t i = 0; i < momentum_.size(); ++i)
    if (stepped_[i]) state.tensors.push_back({params_[i]->name + ".momentum_buffer", momentum_[i]});
  return state;
}

void Sgd::import_state(const OptimizerState& state) {
  if (!state.counts.empty())
    throw Error(fmt::format("optimizer state: '{}' is not state this sgd optimizer keeps", state.counts[0].name));
  std::set<std::string> seen;
  std::vector<size_t> index;  // validated first: a rejected state leaves this optimizer unchanged
  for (const OptimizerState::Entry& e : state.tensors) {
    check_unique(seen, e.name);
    const size_t i = parse_entry_name(e.name, {"momentum_buffer"}).first;
    if (momentum_.empty())
      throw Error(fmt::format("optimizer state: '{}' is a momentum buffer, and this SGD has no momentum", e.name));
    check_like(e.name, e.value, momentum_[i]);
    index.push_back(i);
  }
  stepped_.assign(params_.size(), false);
  for (Tensor& buf : momentum_) buf.zero_();
  for (size_t k = 0; k < index.size(); ++k) {
    momentum_[index[k]].copy_from(state.tensors[k].value);
    stepped_[index[k]] = true;  // the buffer exists: the next update uses momentum
  }
}

AdamW::AdamW(std::vector<Parameter*> params, AdamWOptions options)
    : Optimizer(std::move(params), options.lr), opt_(options) {
  for (Parameter* p : params_) {
    m_.push_back(Tensor::zeros(p->value.shape(), p->value.device()));
    v_.push_back(Tensor::zeros(p->value.shape(), p->value.device()));
  }
  steps_.assign(params_.size(), 0);
}

void AdamW::step() {
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    if (p.grad_is_zero) continue;
    const double t = static_cast<double>(++steps_[i]);  // per parameter, as PyTorch's state["step"]
    const double lr = decimal_as_written(lr_), beta1 = decimal_as_written(opt_.beta1), beta2 = decimal_as_written(opt_.beta2);
    const double bias_correction1 = 1 - std::pow(beta1, t), bias_correction2 = 1 - std::pow(beta2, t);
    const bool decays = !opt_.decay_matrices_only || p.value.shape().size() >= 2;
    const double weight_decay = decays ? decimal_as_written(opt_.weight_decay) : 0.0;
    launch(p.value.device(), p.value.numel(),
           kernels::AdamWUpdate{p.value.data(), p.grad.data(), m_[i].data(), v_[i].data(),
                                static_cast<float>(1 - lr * weight_decay), opt_.beta1,
                                opt_.beta2, static_cast<float>(1 - beta1), static_cast<float>(1 - beta2),
                                static_cast<float>(std::sqrt(bias_correction2)), opt_.eps,
                                static_cast<float>(-lr / bias_correction1)});
  }
}

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

namespace dtrain {

OptimizerState AdamW::export_state() const {
  OptimizerState state;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (steps_[i] == 0) continue;
    state.tensors.push_back({params_[i]->name + ".exp_avg", m_[i]});
    state.tensors.push_back({params_[i]->name + ".exp_avg_sq", v_[i]});
    state.counts.push_back({params_[i]->name + ".step", steps_[i]});
  }
  return state;
}

void AdamW::import_state(const OptimizerState& state) {
  std::set<std::string> seen;
  std::vector<int> present(params_.size(), 0);  // bits: exp_avg, exp_avg_sq, step
  for (const OptimizerState::Entry& e : state.tensors) {
    check_unique(seen, e.name);
    auto [i, key] = parse_entry_name(e.name, {"exp_avg", "exp_avg_sq"});
    check_like(e.name, e.value, key == "exp_avg" ? m_[i] : v_[i]);
    present[i] |= key == "exp_avg" ? 1 : 2;
  }
  for (const OptimizerState::Count& c : state.counts) {
    check_unique(seen, c.name);
    const size_t i = parse_entry_name(c.name, {"step"}).first;
    if (c.value < 1) throw Error(fmt::format("optimizer state: '{}' is {}, expected a step count >= 1", c.name, c.value));
    present[i] |= 4;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (present[i] == 0 || present[i] == 7) continue;
    const char* missing = !(present[i] & 1) ? "exp_avg" : !(present[i] & 2) ? "exp_avg_sq" : "step";
    throw Error(fmt::format("optimizer state: '{}.{}' is missing (the parameter has other AdamW state)",
                            params_[i]->name, missing));
  }
  steps_.assign(params_.size(), 0);
  for (size_t i = 0; i < params_.size(); ++i) {
    m_[i].zero_();
    v_[i].zero_();
  }
  for (const OptimizerState::Entry& e : state.tensors) {
    auto [i, key] = parse_entry_name(e.name, {"exp_avg", "exp_avg_sq"});
    (key == "exp_avg" ? m_[i] : v_[i]).copy_from(e.value);
  }
  for (const OptimizerState::Count& c : state.counts) steps_[parse_entry_name(c.name, {"step"}).first] = c.value;
}

}  // namespace dtrain
