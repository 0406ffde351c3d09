// Optimizers with PyTorch's update rules: SGD (momentum, dampening, Nesterov, weight decay)
// and AdamW (decoupled weight decay). State lives on the parameters' device; export_state()
// and import_state() move it in and out under PyTorch's state_dict names for checkpoints.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/module.h"

namespace dtrain {

enum class OptimizerKind { kSgd, kAdamW };
const char* optimizer_name(OptimizerKind kind);                          // "sgd", "adamw"
std::optional<OptimizerKind> parse_optimizer_kind(const std::string& name);  // the names above

// An optimizer's state as PyTorch's optimizer.state_dict() holds it, keyed "<parameter>.<key>":
// "1.weight.momentum_buffer" (SGD with momentum), "1.weight.exp_avg", "1.weight.exp_avg_sq" and
// "1.weight.step" (AdamW). As in PyTorch, a parameter has no entries until its first update.
// Tensors are float32, shaped as the parameter; counts are the per-parameter step counts (int64
// here; PyTorch holds them as float32 0-d tensors).
struct OptimizerState {
  // A whole tensor, or (ZeRO: Note [Sharded optimizer state] in checkpoint/checkpoint_layout.h)
  // one rank's contiguous slice of it: `value` is then 1-D, elements [offset, offset + numel) of
  // the flattened tensor whose shape is `full_shape`.
  struct Entry {
    std::string name;
    Tensor value;
    int64_t offset = 0;
    std::vector<int64_t> full_shape = {};  // empty: `value` is the whole tensor
    bool is_slice() const { return !full_shape.empty(); }
  };
  struct Count {
    std::string name;
    int64_t value = 0;
  };
  std::vector<Entry> tensors;
  std::vector<Count> counts;
};

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
  virtual OptimizerKind kind() const = 0;
  // The state (see OptimizerState) as views of the optimizer's own tensors, on the parameters'
  // device, not copies: copy them (safetensors::host_copy) before the next step().
  virtual OptimizerState export_state() const = 0;
  // Replaces the whole state with `state` (a parameter it has no entries for starts fresh), so
  // that the following steps are those the exporting optimizer would have taken, to the bit.
  // Throws one line naming the first entry that names no parameter of this optimizer, a key
  // this optimizer does not keep, a shape that differs, or a parameter's missing companion entry.
  virtual void import_state(const OptimizerState& state) = 0;

 protected:
  // The index of the parameter an entry "<parameter>.<key>" belongs to and its key; throws
  // "optimizer state: '<name>' ..." when no parameter has that name or the key is not in `keys`.
  std::pair<size_t, std::string> parse_entry_name(const std::string& name, std::initializer_list<const char*> keys) const;
  // Throws naming `name` when `src` differs from `dst` in shape or dtype.
  static void check_like(const std::string& name, const Tensor& src, const Tensor& dst);

  std::vector<Parameter*> params_;
  float lr_;
};

struct SgdOptions {
  float lr = 0.01f;
  float momentum = 0.f;
  float dampening = 0.f;
  float weight_decay = 0.f;
  bool nesterov = false;
  // As AdamWOptions::decay_matrices_only: the same groups whatever the optimizer.
  bool decay_matrices_only = false;
};

class Sgd : public Optimizer {
 public:
  Sgd(std::vector<Parameter*> params, SgdOptions options);
  void step() override;
  OptimizerKind kind() const override { return OptimizerKind::kSgd; }
  OptimizerState export_state() const override;
  void import_state(const OptimizerState& state) override;

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
  // nanoGPT's parameter groups: weight decay on tensors of 2 or more dimensions only (matrices,
  // embeddings), none on biases and LayerNorm gains.
  bool decay_matrices_only = false;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Parameter*> params, AdamWOptions options);
  void step() override;
  OptimizerKind kind() const override { return OptimizerKind::kAdamW; }
  OptimizerState export_state() const override;
  void import_state(const OptimizerState& state) override;

 private:
  AdamWOptions opt_;
  std::vector<Tensor> m_, v_;
  std::vector<int64_t> steps_;  // per parameter
};

// What make_optimizer() builds: SGD uses momentum (and Nesterov), AdamW its default betas and eps.
struct OptimizerSpec {
  OptimizerKind kind = OptimizerKind::kSgd;
  float lr = 0.01f;
  float momentum = 0.9f;
  float weight_decay = 0.f;  // L2 for SGD, decoupled for AdamW
  bool nesterov = false;
  float eps = 1e-8f;  // AdamW's denominator term, PyTorch's default
  float beta2 = 0.999f;  // AdamW's second-moment decay, PyTorch's default (GPT-2 runs use 0.95)
  bool decay_matrices_only = false;  // see AdamWOptions (SGD and AdamW alike)
};
std::unique_ptr<Optimizer> make_optimizer(const OptimizerSpec& spec, std::vector<Parameter*> params);

}  // namespace dtrain
