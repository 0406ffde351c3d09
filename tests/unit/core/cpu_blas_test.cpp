// OpenBLAS kernel choice: which of OpenBLAS's own picks dtrain overrides, and with what; and
// which library runs a GEMM of a given shape.
#include <dlfcn.h>

#include <string>

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

// Note [Two CPU GEMM libraries]: the skinny products go to BLIS, the MLP's wide ones to OpenBLAS.
TEST(CpuGemmLibrary, SkinnyProductsGoToBlisWideOnesToOpenBlas) {
  EXPECT_TRUE(blis_wins(6, 64 * 784, 25));     // the CNN's first convolution, forward
  EXPECT_TRUE(blis_wins(16, 150, 64 * 100));   // its second, weight gradient
  EXPECT_TRUE(blis_wins(150, 64 * 100, 16));   // ... and input gradient (16 inner products)
  EXPECT_TRUE(blis_wins(64, 10, 256));         // an output layer
  EXPECT_FALSE(blis_wins(64, 256, 784));       // the seed MLP's hidden layer
  EXPECT_FALSE(blis_wins(256, 784, 64));       // ... its weight gradient
  EXPECT_FALSE(blis_wins(64, 2048, 784));
  EXPECT_FALSE(blis_wins(1024, 1024, 1024));
}

// BLIS without kernels for the CPU ("generic") lost every skinny shape to OpenBLAS by 3-5x: it is
// used only with kernels of its own for the CPU, unless DTRAIN_BLIS says otherwise.
TEST(CpuGemmLibrary, BlisOnlyWithKernelsForThisCpu) {
  EXPECT_TRUE(blis_chosen(nullptr, "zen3"));
  EXPECT_TRUE(blis_chosen(nullptr, "haswell"));
  EXPECT_FALSE(blis_chosen(nullptr, "generic"));
  EXPECT_FALSE(blis_chosen("off", "zen3"));
  EXPECT_TRUE(blis_chosen("on", "generic"));
  EXPECT_TRUE(blis_chosen("", "skx"));
}

// BLIS and OpenBLAS both define the CBLAS names; the process must bind cblas_sgemm to OpenBLAS,
// or every "wide" GEMM silently runs on BLIS (as it did when libdtrain_core listed BLIS first).
TEST(CpuGemmLibrary, CblasSgemmIsOpenBlas) {
  void* sym = dlsym(RTLD_DEFAULT, "cblas_sgemm");
  ASSERT_NE(sym, nullptr);
  Dl_info info{};
  ASSERT_NE(dladdr(sym, &info), 0);
  EXPECT_NE(std::string(info.dli_fname).find("openblas"), std::string::npos) << "cblas_sgemm comes from " << info.dli_fname;
}

}  // namespace
}  // namespace dtrain
