// Parameter initialisation as PyTorch does it for Linear and Conv2d: kaiming_uniform_(a=sqrt(5))
// for weights and U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for biases, both bound = 1/sqrt(fan_in).
// Drawn on the host from a seeded generator whose draws are identical on every platform.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace dtrain {

class InitRng {
 public:
  explicit InitRng(uint64_t seed) : seed_(seed) {}
  float uniform(float lo, float hi);  // [lo, hi): draw n is kernels::uniform01(seed, n)
  float normal(float mean, float std);  // Box-Muller over two uniform draws (GPT-2's init)
  // Skips `draws` uniform draws (a normal takes two) in O(1): the draws are counter-based, so a
  // layer built alone draws what it would in the whole model (Note [Stage construction]).
  void skip(uint64_t draws) { draws_ += draws; }

 private:
  uint64_t seed_;
  uint64_t draws_ = 0;
};

void uniform_init(Tensor& t, float bound, InitRng& rng);  // U(-bound, bound), any device
float fan_in_bound(int64_t fan_in);                       // 1/sqrt(fan_in)
void normal_init(Tensor& t, float std, InitRng& rng);      // N(0, std^2), any device

}  // namespace dtrain
