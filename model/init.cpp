#include "model/init.h"

#include <cmath>
#include <vector>

#include "core/memory.h"

namespace dtrain {

float InitRng::uniform(float lo, float hi) {
  // splitmix64: tiny, fast, and defined by its arithmetic alone (unlike std:: distributions).
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
  return lo + (hi - lo) * u;
}

void uniform_init(Tensor& t, float bound, InitRng& rng) {
  std::vector<float> host(static_cast<size_t>(t.numel()));
  for (float& v : host) v = rng.uniform(-bound, bound);
  copy_bytes(t.data(), t.device(), host.data(), Device::cpu(), t.nbytes());
}

float fan_in_bound(int64_t fan_in) { return fan_in > 0 ? 1.0f / std::sqrt(static_cast<float>(fan_in)) : 0.f; }

}  // namespace dtrain
