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

#include "model/flat_store.h"
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

// Note [Flat store] (model/flat_store.h): the optimizer's state lives in the store's index
// space, compacted to the ranges this process owns (all of it, or its ZeRO shards: Note [ZeRO
// shards] in ddp/zero_plan.h). A step is one kernel launch per owned range and per run of
// parameters that take the same scalars (weight decay or not, the same step count, not skipped):
// one launch for a whole MLP, where it used to be one per parameter. The floats are those of the
// per-parameter update: the same functor over the same elements.
class Optimizer {
 public:
  Optimizer(std::vector<Parameter*> params, float lr);
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;
  // Updates the owned ranges, then calls the store's after-step hook (ZeRO's all-gather).
  // Virtual, as export_state and import_state, for optimizers of tests that hold a fixed state.
  virtual void step();
  // Lazy (see Parameter::grad_is_zero). As with PyTorch's zero_grad(set_to_none=True), step()
  // leaves a parameter alone, weight decay and momentum included, if no backward wrote its
  // gradient since.
  void zero_grad();
  void set_lr(float lr) { lr_ = lr; }
  float lr() const { return lr_; }
  virtual OptimizerKind kind() const = 0;
  // The state (see OptimizerState) as views of the optimizer's own tensors, on the parameters'
  // device, not copies: copy them (safetensors::host_copy) before the next step(). A parameter
  // this process owns only part of (ZeRO) gives slice entries of that part.
  virtual OptimizerState export_state() const;
  // Replaces the whole state with `state` (a parameter it has no entries for starts fresh), so
  // that the following steps are those the exporting optimizer would have taken, to the bit.
  // Whole tensors and slices are accepted: each entry's part this process owns is taken (the
  // rest is another rank's), and the owned part of every parameter with state must be covered
  // exactly once. Throws one line naming the first entry that names no parameter of this
  // optimizer, a key this optimizer does not keep, a shape that differs, a slice that overlaps
  // another, or a parameter's missing companion entry or uncovered elements.
  virtual void import_state(const OptimizerState& state);

  // Kernel launches of all step() calls so far (for benches and tests).
  int64_t launches() const { return launches_; }
  // Bytes of optimizer state this process holds.
  size_t state_bytes() const;
  FlatStore& store() { return *store_; }
  // This process's part of each parameter it updates: elements [offset, offset + count) of the
  // flattened parameter (ZeRO: its shard's piece; else the whole of it). A resume asks the
  // checkpoint for exactly these slices of every state key (train/optimizer_transfer.h:
  // wanted_pieces), for the layout the store has when it asks.
  struct OwnedPart {
    const Parameter* param = nullptr;
    int64_t offset = 0, count = 0;
  };
  std::vector<OwnedPart> owned_parts() const;
  // The names of the state tensors each parameter has ("exp_avg", ...; none for SGD without momentum).
  std::vector<const char*> state_keys() const { return tensor_keys(); }

 protected:
  // This process's part of parameter i: elements [param_offset, param_offset + count) of the
  // flattened parameter, at `state_offset` of the compact state arrays (count 0: none).
  struct Piece {
    int64_t param_offset = 0, count = 0, state_offset = 0;
  };
  // What Sgd and AdamW define (the defaults: no state, nothing to update).
  virtual void update(const FlatRun& run, int64_t state_offset, int64_t n) { (void)run, (void)state_offset, (void)n; }
  virtual std::optional<std::vector<int64_t>> run_key(size_t i) const {  // nullopt: skip this step
    (void)i;
    return std::nullopt;
  }
  virtual void advance(size_t i) { (void)i; }  // before the launches: parameter i is updated this step
  virtual void finish_step() {}                 // after them
  // The state's keys, in the order of state_arrays(); counts (AdamW's "step") separately.
  virtual std::vector<const char*> tensor_keys() const { return {}; }
  virtual std::vector<Tensor*> state_arrays() { return {}; }
  virtual bool has_state(size_t i) const { return (void)i, false; }
  virtual int64_t count_of(size_t i) const { return (void)i, 0; }  // 0: no count key
  virtual const char* count_key() const { return nullptr; }
  virtual void reset_state(const std::vector<int64_t>& counts, const std::vector<bool>& present) {
    (void)counts, (void)present;
  }
  // Call from the derived constructor once its state arrays exist.
  void init_state();

  std::pair<size_t, std::string> parse_entry_name(const std::string& name, const std::vector<const char*>& keys) const;
  Tensor state_view(const Tensor& array, size_t i) const;
  // Throws naming `name` when `src` differs from `dst` in shape or dtype.
  static void check_like(const std::string& name, const Tensor& src, const Tensor& dst);
  const Parameter& param(size_t i) const { return *params_[i]; }
  bool decays(size_t i, bool matrices_only) const { return !matrices_only || params_[i]->value.shape().size() >= 2; }

  std::vector<Parameter*> params_;
  float lr_;
  std::shared_ptr<FlatStore> store_;
  std::vector<Piece> pieces_;
  int64_t state_size_ = 0;

 private:
  void place_pieces();
  void relayout(const FlatStore::Relayout& change);

  int listener_ = -1;
  std::vector<size_t> order_;  // parameters by flat offset
  int64_t launches_ = 0;
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
  OptimizerKind kind() const override { return OptimizerKind::kSgd; }

 private:
  void update(const FlatRun& run, int64_t state_offset, int64_t n) override;
  std::optional<std::vector<int64_t>> run_key(size_t i) const override;
  void finish_step() override;
  std::vector<const char*> tensor_keys() const override;
  std::vector<Tensor*> state_arrays() override;
  bool has_state(size_t i) const override { return stepped_[i]; }
  int64_t count_of(size_t) const override { return 0; }
  void reset_state(const std::vector<int64_t>& counts, const std::vector<bool>& present) override;

  SgdOptions opt_;
  Tensor momentum_;  // compact (Optimizer::Piece); undefined without momentum
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
  OptimizerKind kind() const override { return OptimizerKind::kAdamW; }

 private:
  void update(const FlatRun& run, int64_t state_offset, int64_t n) override;
  std::optional<std::vector<int64_t>> run_key(size_t i) const override;
  void advance(size_t i) override { ++steps_[i]; }  // per parameter, as PyTorch's state["step"]
  std::vector<const char*> tensor_keys() const override { return {"exp_avg", "exp_avg_sq"}; }
  std::vector<Tensor*> state_arrays() override { return {&m_, &v_}; }
  bool has_state(size_t i) const override { return steps_[i] > 0; }
  int64_t count_of(size_t i) const override { return steps_[i]; }
  const char* count_key() const override { return "step"; }
  void reset_state(const std::vector<int64_t>& counts, const std::vector<bool>& present) override;

  AdamWOptions opt_;
  Tensor m_, v_;  // compact (Optimizer::Piece)
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
