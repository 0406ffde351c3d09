#include "model/optimizer.h"

#include <cmath>

#include "core/error.h"
#include "model/kernels.h"

namespace dtrain {

void Optimizer::zero_grad() {
  for (Parameter* p : params_) p->grad_is_zero = true;
}

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
    launch(p.value.device(), p.value.numel(),
           kernels::SgdUpdate{p.value.data(), p.grad.data(), buf, lr_, opt_.weight_decay, first ? 0.f : opt_.momentum,
                              first ? 1.f : 1.f - opt_.dampening, opt_.nesterov ? 1.f : 0.f,
                              opt_.nesterov ? opt_.momentum : 1.f});
    stepped_[i] = true;
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
    const float t = static_cast<float>(++steps_[i]);  // per parameter, as PyTorch's state["step"]
    const float bc1 = 1.f - std::pow(opt_.beta1, t);
    const float bc2 = 1.f - std::pow(opt_.beta2, t);
    launch(p.value.device(), p.value.numel(),
           kernels::AdamWUpdate{p.value.data(), p.grad.data(), m_[i].data(), v_[i].data(), lr_, opt_.beta1,
                                opt_.beta2, opt_.eps, opt_.weight_decay, bc1, bc2});
  }
}

const char* optimizer_name(OptimizerKind kind) { return kind == OptimizerKind::kAdamW ? "adamw" : "sgd"; }

std::optional<OptimizerKind> parse_optimizer_kind(const std::string& name) {
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "adamw") return OptimizerKind::kAdamW;
  return std::nullopt;
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerSpec& spec, std::vector<Parameter*> params) {
  if (spec.kind == OptimizerKind::kAdamW) {
    AdamWOptions o;
    o.lr = spec.lr;
    o.weight_decay = spec.weight_decay;
    return std::make_unique<AdamW>(std::move(params), o);
  }
  return std::make_unique<Sgd>(std::move(params), SgdOptions{spec.lr, spec.momentum, 0.f, spec.weight_decay, spec.nesterov});
}

}  // namespace dtrain
