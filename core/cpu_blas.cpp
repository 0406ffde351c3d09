#include "core/cpu_blas.h"

#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>

#ifdef DTRAIN_WITH_BLIS
#include "core/blis_gemm.h"
#endif

namespace dtrain {

std::string preferred_blas_coretype() {
  if (std::getenv("OPENBLAS_CORETYPE")) return "";
  if (const char* v = std::getenv("DTRAIN_BLAS_CORETYPE"); v && std::strcmp(v, "off") == 0) return "";
#if defined(__x86_64__)
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vl");
  const bool avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return better_blas_coretype(blas_corename(), avx2_fma, avx512);
#else
  return "";
#endif
}

std::string better_blas_coretype(const std::string& current, bool avx2_fma, bool avx512) {
  // OpenBLAS's x86-64 kernel sets without AVX2 (its fallbacks for CPUs it does not recognise).
  static const std::set<std::string> pre_avx2 = {"Prescott", "Core2",     "Penryn",     "Dunnington", "Nehalem",
                                                 "Atom",     "Barcelona", "Opteron",    "Bobcat",     "Sandybridge",
                                                 "Bulldozer", "Piledriver", "Steamroller", "Excavator"};
  const bool avx2_set = current == "Haswell" || current == "Zen";
  if (avx512 && (avx2_set || pre_avx2.count(current))) return "SkylakeX";
  if (avx2_fma && !avx512 && pre_avx2.count(current)) return "Haswell";
  return "";
}

std::string blas_corename() {
  const char* name = openblas_get_corename();
  return name ? name : "";
}

bool blis_wins(int64_t m, int64_t n, int64_t k) {
  constexpr int64_t kSkinny = 32;
  return std::min({m, n, k}) <= kSkinny;
}

bool blis_chosen(const char* env, const std::string& blis_arch) {
  if (env && std::strcmp(env, "off") == 0) return false;
  if (env && std::strcmp(env, "on") == 0) return true;
  return blis_arch != "generic";
}

bool blis_enabled() {
#ifdef DTRAIN_WITH_BLIS
  static const bool enabled = blis_chosen(std::getenv("DTRAIN_BLIS"), blis_arch_name());
  return enabled;
#else
  return false;
#endif
}

}  // namespace dtrain
