// OpenBLAS kernel choice: which of OpenBLAS's own picks dtrain overrides, and with what.
#include <gtest/gtest.h>

#include "core/cpu_blas.h"

namespace dtrain {
namespace {

TEST(BlasCoretype, Avx512CpusGetSkylakeXOverAvx2AndOlderKernels) {
  EXPECT_EQ(better_blas_coretype("Zen", true, true), "SkylakeX");        // Zen 4 on OpenBLAS 0.3.21
  EXPECT_EQ(better_blas_coretype("Haswell", true, true), "SkylakeX");
  EXPECT_EQ(better_blas_coretype("Prescott", true, true), "SkylakeX");   // a CPU newer than OpenBLAS
  EXPECT_EQ(better_blas_coretype("Sandybridge", true, true), "SkylakeX");
}

TEST(BlasCoretype, Avx2CpusGetHaswellOnlyOverOlderKernels) {
  EXPECT_EQ(better_blas_coretype("Prescott", true, false), "Haswell");
  EXPECT_EQ(better_blas_coretype("Nehalem", true, false), "Haswell");
  EXPECT_EQ(better_blas_coretype("Zen", true, false), "");
  EXPECT_EQ(better_blas_coretype("Haswell", true, false), "");
}

TEST(BlasCoretype, KeepsGoodOrUnknownChoicesAndNeverAsksForMoreThanTheCpuHas) {
  EXPECT_EQ(better_blas_coretype("SkylakeX", true, true), "");
  EXPECT_EQ(better_blas_coretype("SapphireRapids", true, true), "");
  EXPECT_EQ(better_blas_coretype("SomethingNew", true, true), "");
  EXPECT_EQ(better_blas_coretype("Prescott", false, false), "");  // no AVX2: its fallback is right
  EXPECT_EQ(better_blas_coretype("", true, true), "");
}

}  // namespace
}  // namespace dtrain
