#include "model/init.h"

#include <cmath>
#include <vector>

#include "core/memory.h"
#include "model/kernels.h"

namespace dtrain {

float InitRng::uniform(float lo, float hi) {
  // The counter-based splitmix64 that dropout uses: defined by its arithmetic alone (unlike
  // std:: distributions), so every platform draws the same initial weights.
  return lo + (hi - lo) * kernels::uniform01(seed_, draws_++);
}

void uniform_init(Tensor& t, float bound, InitRng& rng) {
  std::vector<float> host(static_cast<size_t>(t.numel()));
  for (float& v : host) v = rng.uniform(-bound, bound);
  copy_bytes(t.data(), t.device(), host.data(), Device::cpu(), t.nbytes());
}

float fan_in_bound(int64_t fan_in) { return fan_in > 0 ? 1.0f / std::sqrt(static_cast<float>(fan_in)) : 0.f; }

}  // namespace dtrain
