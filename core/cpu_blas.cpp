#include "core/cpu_blas.h"

#include <cblas.h>

#include <cstdlib>
#include <cstring>

namespace dtrain {

std::string preferred_blas_coretype() {
  if (std::getenv("OPENBLAS_CORETYPE")) return "";
  if (const char* v = std::getenv("DTRAIN_BLAS_CORETYPE"); v && std::strcmp(v, "off") == 0) return "";
#if defined(__x86_64__)
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vl");
  const std::string core = blas_corename();
  if (avx512 && (core == "Haswell" || core == "Zen")) return "SkylakeX";
#endif
  return "";
}

std::string blas_corename() {
  const char* name = openblas_get_corename();
  return name ? name : "";
}

}  // namespace dtrain
