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

float InitRng::normal(float mean, float std) {
  // 1 - u lies in (0, 1], so the log is finite; one value per pair of draws (the cosine branch).
  const float u1 = 1.f - uniform(0.f, 1.f), u2 = uniform(0.f, 1.f);
  constexpr float kTwoPi = 6.28318530717958647692f;
  return mean + std * std::sqrt(-2.f * std::log(u1)) * std::cos(kTwoPi * u2);
}

void normal_init(Tensor& t, float std, InitRng& rng) {
  std::vector<float> host(static_cast<size_t>(t.numel()));
  for (float& v : host) v = rng.normal(0.f, std);
  copy_bytes(t.data(), t.device(), host.data(), Device::cpu(), t.nbytes());
}

void uniform_init(Tensor& t, float bound, InitRng& rng) {
  std::vector<float> host(static_cast<size_t>(t.numel()));
  for (float& v : host) v = rng.uniform(-bound, bound);
  copy_bytes(t.data(), t.device(), host.data(), Device::cpu(), t.nbytes());
}

float fan_in_bound(int64_t fan_in) { return fan_in > 0 ? 1.0f / std::sqrt(static_cast<float>(fan_in)) : 0.f; }

}  // namespace dtrain
