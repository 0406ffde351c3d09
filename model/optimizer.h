// Optimizers with PyTorch's update rules: SGD (momentum, dampening, Nesterov, weight decay)
// and AdamW (decoupled weight decay). State lives on the parameters' device.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/module.h"

namespace dtrain {

class Optimizer {
 public:
  explicit Optimizer(std::vector<Parameter*> params, float lr) : params_(std::move(params)), lr_(lr) {}
  virtual ~Optimizer() = default;
  virtual void step() = 0;
  // Lazy (see Parameter::grad_is_zero). As with PyTorch's zero_grad(set_to_none=True), step()
  // leaves a parameter alone, weight decay and momentum included, if no backward wrote its
  // gradient since.
  void zero_grad();
  void set_lr(float lr) { lr_ = lr; }
  float lr() const { return lr_; }

 protected:
  std::vector<Parameter*> params_;
  float lr_;
};

struct SgdOptions {
  float lr = 0.01f;
  float momentum = 0.f;
  float dampening = 0.f;
  float weight_decay = 0.f;
  bool nesterov = false;
};

class Sgd : public Optimizer {
 public:
  Sgd(std::vector<Parameter*> params, SgdOptions options);
  void step() override;

 private:
  SgdOptions opt_;
  std::vector<Tensor> momentum_;
  std::vector<bool> stepped_;  // per parameter: its momentum buffer starts at its first update
};

struct AdamWOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Parameter*> params, AdamWOptions options);
  void step() override;

 private:
  AdamWOptions opt_;
  std::vector<Tensor> m_, v_;
  std::vector<int64_t> steps_;  // per parameter
};

enum class OptimizerKind { kSgd, kAdamW };
const char* optimizer_name(OptimizerKind kind);                          // "sgd", "adamw"
std::optional<OptimizerKind> parse_optimizer_kind(const std::string& name);  // the names above

// What make_optimizer() builds: SGD uses momentum (and Nesterov), AdamW its default betas and eps.
struct OptimizerSpec {
  OptimizerKind kind = OptimizerKind::kSgd;
  float lr = 0.01f;
  float momentum = 0.9f;
  float weight_decay = 0.f;  // L2 for SGD, decoupled for AdamW
  bool nesterov = false;
};
std::unique_ptr<Optimizer> make_optimizer(const OptimizerSpec& spec, std::vector<Parameter*> params);

}  // namespace dtrain
