// Choosing the CPU's GEMM: OpenBLAS's kernel set for this CPU, and OpenBLAS or BLIS for a shape.
// OpenBLAS's kernel for this CPU: OpenBLAS 0.3.21 (Debian 12) does not know AMD Zen 4
// and falls back to its AVX2 "Haswell"/"Zen" kernels although the CPU has AVX-512; measured
// here, its AVX-512 "SkylakeX" kernels run the trainer's GEMMs 1.7-1.9x faster. The kernel is
// fixed when the library loads, so the choice is an environment variable read at start-up.
// Newer CPUs than it knows (an H100 host's, measured) get its SSE3 "Prescott" fallback.
#pragma once

#include <cstdint>
#include <string>

namespace dtrain {

// The OpenBLAS core type to request for this machine, or "" to keep OpenBLAS's own choice
// (also when the user set OPENBLAS_CORETYPE, or DTRAIN_BLAS_CORETYPE=off).
std::string preferred_blas_coretype();

// The pure decision: `current` is OpenBLAS's own choice; the flags say what the CPU runs.
// AVX-512 CPUs get "SkylakeX" over any AVX2-or-older kernel set, AVX2+FMA CPUs "Haswell" over
// an older one; "" keeps `current` (also for names this function does not know).
std::string better_blas_coretype(const std::string& current, bool avx2_fma, bool avx512);

// Name of the kernel set OpenBLAS is using in this process ("Haswell", "SkylakeX", ...).
std::string blas_corename();

// Note [Two CPU GEMM libraries] (core/ops.cpp): whether BLIS rather than OpenBLAS runs a CPU GEMM
// of this shape (row-major C[m,n] += A[m,k] B[k,n]): a side of 32 or less, the convolutions'
// 6 or 16 output channels and the output layers' 10 classes. The pure rule; blis_enabled() says
// whether this build and environment may use BLIS at all.
bool blis_wins(int64_t m, int64_t n, int64_t k);
// Built with BLIS, and blis_chosen(DTRAIN_BLIS, the configuration BLIS picked) (read once).
bool blis_enabled();
// The pure decision: DTRAIN_BLIS=off never, =on always (for comparisons); otherwise only when
// BLIS has kernels for this CPU. Its "generic" configuration (reference C kernels: BLIS 0.9 on
// a CPU newer than it knows) ran every skinny shape 3-5x slower than OpenBLAS.
bool blis_chosen(const char* env, const std::string& blis_arch);

}  // namespace dtrain
