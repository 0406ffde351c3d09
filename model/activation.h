// Stateless shape-preserving layers: ReLU, GELU, Flatten, Dropout.
#pragma once

#include <cstdint>

#include "model/module.h"

namespace dtrain {

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, bool need_input_grad = true) override;
  std::string describe() const override { return "ReLU()"; }
  // The identity from now on when `previous` applies this ReLU itself (Note [Fused ReLU]).
  void fuse_into(Module& previous) override { fused_ = previous.absorb_following_relu(); }

 private:
  bool fused_ = false;
  Tensor output_, grad_input_;
};

// GELU with the tanh approximation (torch.nn.GELU(approximate="tanh"), GPT-2's); backward
// recomputes the tanh from the cached input rather than keeping a second activation.
class GELU : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, bool need_input_grad = true) override;
  std::string describe() const override { return "GELU(approximate='tanh')"; }
  void release_backward_scratch() override { grad_input_ = {}; }
  // backward() written over grad_output, which it returns: for a caller whose gradient buffer is
  // dead once GELU has read it (the GPT's MLP: c_proj's input gradient, 4C wide). One 4C-wide
  // buffer fewer, and the pass writes lines it has just read. The same floats as backward().
  Tensor backward_in_place(Tensor grad_output);

 private:
  Tensor input_, output_, grad_input_;
};

// [B, d1, d2, ...] -> [B, d1*d2*...]; a view, no copy.
class Flatten : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, bool need_input_grad = true) override;
  std::string describe() const override { return "Flatten()"; }

 private:
  Shape input_shape_;
};

// Inverted dropout: zeroes with probability p in training, scales survivors by 1/(1-p);
// identity in evaluation. The mask comes from a counter-based hash of (seed, call, index).
class Dropout : public Module {
 public:
  Dropout(float p, uint64_t seed);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, bool need_input_grad = true) override;
  std::string describe() const override;
  // The draws so far: mask element i of the next forward is hash(seed, counter + i).
  std::vector<uint64_t*> rng_counters() override { return {&counter_}; }

 private:
  float p_;
  uint64_t seed_;
  uint64_t counter_ = 0;
  bool masked_ = false;  // whether the last forward applied a mask
  Tensor output_, mask_, grad_input_;
};

}  // namespace dtrain
