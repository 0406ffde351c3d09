// Parameter initialisation as PyTorch does it for Linear and Conv2d: kaiming_uniform_(a=sqrt(5))
// for weights and U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for biases, both bound = 1/sqrt(fan_in);
// and GPT-2's normal(0, std) for the transformer's weights.
// Drawn on the host from a seeded generator whose draws are identical on every platform.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace dtrain {

class InitRng {
 public:
  explicit InitRng(uint64_t seed) : seed_(seed) {}
  float uniform(float lo, float hi);  // [lo, hi): draw n is kernels::uniform01(seed, n)
  // N(mean, std) by Box-Muller over two uniform draws (one value per pair, no cached second
  // value, so the stream stays a plain function of the draw counter).
  float normal(float mean, float std);

 private:
  uint64_t seed_;
  uint64_t draws_ = 0;
};

void uniform_init(Tensor& t, float bound, InitRng& rng);  // U(-bound, bound), any device
void normal_init(Tensor& t, float std, InitRng& rng);     // N(0, std), any device (GPT-2's init)
float fan_in_bound(int64_t fan_in);                       // 1/sqrt(fan_in)

}  // namespace dtrain
