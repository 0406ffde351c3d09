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
  // Box-Muller in double from two 24-bit uniforms: 1 - u1 is in (0, 1], so the log is finite.
  // log and cos of double round to the same float on every IEEE platform short of a value
  // within 2^-29 of a float rounding boundary; the draws themselves are exact.
  const double u1 = uniform(0.f, 1.f), u2 = uniform(0.f, 1.f);
  const double z = std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2.0 * 3.14159265358979323846 * u2);
  return static_cast<float>(mean + std * z);
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
