// What the CPU convolution kernels compiled three times (model/cpu_direct_conv.cpp,
// model/cpu_winograd_conv.cpp) share: vectors of V floats as GCC vector extensions, their
// unaligned loads and stores, and the choice of build (AVX-512, AVX2 + FMA, SSE2) by the CPU.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace dtrain::cpu::vec {

template <int V>
using Vec [[gnu::vector_size(V * sizeof(float))]] = float;
template <int V>
using Bits [[gnu::vector_size(V * sizeof(float))]] = int32_t;

// Unaligned loads and stores. Vectors pass by reference: by value, the wide vectors' calling
// convention would differ between the builds (-Wpsabi).
template <int V>
[[gnu::always_inline]] inline void load(Vec<V>& v, const float* p) {
  __builtin_memcpy(&v, p, sizeof v);
}

template <int V>
[[gnu::always_inline]] inline void store(float* p, const Vec<V>& v) {
  __builtin_memcpy(p, &v, sizeof v);
}

// The builds this CPU runs, best first (Build has a `name`); avx512 and avx2 are only looked at
// on x86-64 with GCC, where they are compiled.
template <class Build>
std::vector<Build> runnable_builds(const Build& avx512, const Build& avx2, const Build& generic) {
  std::vector<Build> r;
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")) r.push_back(avx512);  // compiled for both
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) r.push_back(avx2);
#else
  (void)avx512;
  (void)avx2;
#endif
  r.push_back(generic);
  return r;
}

// chosen = the build named ("" = the best), false when this CPU cannot run it.
template <class Build>
bool select_build(const std::vector<Build>& builds, std::string_view name, Build& chosen) {
  for (const Build& b : builds)
    if (name.empty() || name == b.name) {
      chosen = b;
      return true;
    }
  return false;
}

}  // namespace dtrain::cpu::vec
