// Module: the layer interface. forward() caches what backward() needs; backward() accumulates
// parameter gradients (PyTorch semantics: += until the optimizer's zero_grad) and calls the
// gradient-ready hook for each parameter the moment its gradient for this backward is final,
// in backward order. DDP uses that hook to start bucket all-reduces while backward continues.
//
// Note [Writing a layer]: a layer of your own (examples/custom_model/ has one) is a Module that
//  1. holds each trainable tensor as a Parameter member {name, value, grad}: the name is local
//     ("weight"; Sequential prefixes the child's index), grad has the value's shape and device;
//  2. returns pointers to them from parameters(), in forward order (DDP checks that every rank
//     has the same list, broadcasts rank 0's values, and buckets the gradients in reverse);
//  3. in backward(), writes each gradient with beta = take_grad_beta(p) (0 right after the
//     optimizer's zero_grad, else 1: accumulate) and then calls grad_ready(p), exactly once per
//     backward and as early as the gradient is final, so its all-reduce starts while the rest
//     of backward runs; it skips the input gradient when need_input_grad is false;
//  4. returns non-trainable state that must match across replicas from buffers() (BatchNorm's
//     running statistics), named like parameters ("running_mean"); DDP broadcasts rank 0's
//     before each training forward, checkpoints and model.safetensors hold them.
// A layer never replaces p.value's or p.grad's storage: both become views into a flat store.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/amp.h"

namespace dtrain {

class FlatStore;
class BatchStatsSync;

struct Parameter {
  std::string name;  // "0.weight", as PyTorch's Sequential names them
  Tensor value;
  Tensor grad;  // same shape and device; DDP may replace it with a view into a bucket
  // Set by Optimizer::zero_grad(): the gradient is absent (its memory was not cleared); the next
  // backward overwrites it (GEMM beta 0) instead of accumulating, and an optimizer step skips the
  // parameter until then. Saves a memset and a read of every gradient per step, with the
  // semantics of PyTorch's zero_grad(set_to_none=True).
  bool grad_is_zero = false;
  // The flat store value and grad are views into (Note [Flat store] in model/flat_store.h), once
  // an optimizer or DDP made one; shared by every parameter of it.
  std::shared_ptr<FlatStore> store = nullptr;
  // Called before every write of `grad` (take_grad_beta): under ZeRO-2 DDP lends gradient memory
  // bucket by bucket during backward and points `grad` at it here (Note [ZeRO-2 gradient ring]
  // in ddp/reducer.h). Unset: `grad` stays where it is.
  std::function<void(Parameter&)> before_grad_write = nullptr;
};

// The beta for writing p's gradient (0: overwrite, 1: accumulate); marks it written. Call it
// before reading p.grad's address: the call may move p.grad (before_grad_write).
inline float take_grad_beta(Parameter& p) {
  if (p.before_grad_write) p.before_grad_write(p);
  const float beta = p.grad_is_zero ? 0.f : 1.f;
  p.grad_is_zero = false;
  return beta;
}

// A buffer: state that is not trained but saved and kept equal across replicas (PyTorch's
// register_buffer), e.g. BatchNorm's running_mean and its int64 num_batches_tracked.
struct Buffer {
  std::string name;  // "running_mean"; containers prefix it as they do parameter names
  Tensor value;
};

using GradReadyHook = std::function<void(Parameter&)>;

class Module {
 public:
  virtual ~Module() = default;

  virtual Tensor forward(const Tensor& input) = 0;
  // Returns the gradient of the input, or an undefined Tensor when !need_input_grad (the
  // first layer skips that GEMM: the data needs no gradient).
  virtual Tensor backward(const Tensor& grad_output, bool need_input_grad = true) = 0;

  // Parameters in forward order. Pointers stay valid for the module's lifetime.
  virtual std::vector<Parameter*> parameters() { return {}; }
  // Non-trainable state that must match across replicas, in forward order (BatchNorm's).
  virtual std::vector<Buffer*> buffers() { return {}; }
  // Random-number state that advances as the module trains (Dropout's mask counter), in forward
  // order: a checkpoint saves it so that a resumed run draws the masks the uninterrupted run
  // would have drawn. Pointers stay valid for the module's lifetime.
  virtual std::vector<uint64_t*> rng_counters() { return {}; }

  virtual void set_training(bool training) { training_ = training; }
  bool training() const { return training_; }
  // Mixed precision for this module's matmuls (containers pass it to their children); layers
  // without a matmul that benefits ignore it. Takes effect from the next forward().
  virtual void set_amp(AmpMode) {}
  virtual void set_grad_ready_hook(GradReadyHook hook) { hook_ = std::move(hook); }
  virtual std::string describe() const = 0;  // "Linear(784, 256)"

  // Note [Fused ReLU]: a layer whose output pass can also apply a ReLU that follows it (Linear,
  // Conv2d) answers true here and from then on outputs ReLU(y), masking its gradient by that
  // output in backward. Sequential offers each layer to the one before it (fuse_into): a ReLU
  // that was absorbed becomes the identity, keeping its place, so parameter names ("2.weight")
  // and describe() do not change. One pass over the activations and one over their gradient
  // fewer per fused pair; the floats equal the unfused forward's.
  virtual bool absorb_following_relu() { return false; }
  // Note [SyncBatchNorm] (model/batchnorm.h): BatchNorm layers take their training statistics
  // over every rank through `sync` (nullptr: this rank's batch only); containers pass it on.
  virtual void set_batch_stats_sync(std::shared_ptr<BatchStatsSync> sync) { (void)sync; }
  virtual void fuse_into(Module& previous) { (void)previous; }
  // Note [Backward scratch]: drops the buffers that only backward() writes and that are dead once
  // it has returned (its gradients of inner activations), so that they go back to the host
  // allocator's cache. A container whose children run backward one after another (the GPT's
  // blocks) calls it on each child as the child finishes: the next child's backward then takes
  // the same, already touched, memory from the cache instead of pages of its own. That is L - 1
  // blocks' scratch less to fault in on the first step and to keep (94 MiB of the step bench's
  // peak RSS at issue 21's CPU shape), for a few cache look-ups per step. The gradient backward()
  // returned stays alive while its caller holds it (tensors share their storage).
  virtual void release_backward_scratch() {}

 protected:
  void grad_ready(Parameter& p) {
    if (hook_) hook_(p);
  }
  bool training_ = true;

 private:
  GradReadyHook hook_;
};

// Prefixes the names of `m`'s parameters and buffers with "<prefix>." (a container naming a
// child, as PyTorch's state_dict does: "layer1.0.conv1.weight").
inline void prefix_names(Module& m, const std::string& prefix) {
  for (Parameter* p : m.parameters()) p->name = prefix + "." + p->name;
  for (Buffer* b : m.buffers()) b->name = prefix + "." + b->name;
}

// One named tensor of a module's state_dict: its parameters, then its buffers (checkpoints,
// model.safetensors, --init-weights).
struct NamedTensor {
  const std::string* name;
  Tensor* value;
};
inline std::vector<NamedTensor> state_tensors(Module& m) {
  std::vector<NamedTensor> out;
  for (Parameter* p : m.parameters()) out.push_back({&p->name, &p->value});
  for (Buffer* b : m.buffers()) out.push_back({&b->name, &b->value});
  return out;
}

}  // namespace dtrain
