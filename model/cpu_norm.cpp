// The CPU loops of model/cpu_norm.h. Each plane is summed as kernels::sum4 sums it: four
// interleaved partial sums (element p into partial p % 4, the tail into the first), combined as
// (s0 + s1) + (s2 + s3), and the planes added in order of n into the channel's double sum.
// The partials are an array the compiler keeps in one vector register (AVX2: four doubles);
// no FMA (Note on DTRAIN_CPU_CLONES in core/launch.h), so every clone gives the same bits.
#include "model/cpu_norm.h"

#include <cstring>
#include <string_view>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#endif

namespace dtrain::cpu {

// The helpers below pass 32-byte vectors by value; they are internal and inlined, so GCC's
// note that this ABI differs with and without AVX concerns no caller.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace {

// Four floats and four doubles as GCC/Clang vectors: the four partial sums in one register (two
// on plain x86-64), the arithmetic element by element as the scalar code's (no reordering).
typedef float F4 __attribute__((vector_size(16)));
typedef double D4 __attribute__((vector_size(32)));
typedef int32_t I4 __attribute__((vector_size(16)));

inline D4 load4(const float* p) {
  F4 v;
  std::memcpy(&v, p, sizeof v);
  return __builtin_convertvector(v, D4);
}
// By reference: a 32-byte vector passed by value draws GCC's -Wpsabi note on every build.
inline double combine(const D4& s) { return (s[0] + s[1]) + (s[2] + s[3]); }

// s1[j] += the sum of d = double(x[p]) - k[j] and s2[j] += the sum of d^2 (Note [Shifted
// statistics] in model/norm_kernels.h) over each of P planes (plane j at x + j * n: consecutive
// channels of one image), each plane in sum4's order. The P planes' partial sums are independent
// chains, so the CPU overlaps their additions.
template <int P>
__attribute__((always_inline)) inline void plane_moments(const float* __restrict x, int64_t n, const double* k,
                                                         double* s1, double* s2) {
  D4 a[P], b[P];
  for (int j = 0; j < P; ++j) a[j] = b[j] = D4{0.0, 0.0, 0.0, 0.0};
  int64_t p = 0;
  for (; p + 4 <= n; p += 4)
    for (int j = 0; j < P; ++j) {
      const D4 d = load4(x + j * n + p) - k[j];  // k[j] in every lane
      a[j] += d;
      b[j] += d * d;
    }
  for (; p < n; ++p)
    for (int j = 0; j < P; ++j) {
      const double d = static_cast<double>(x[j * n + p]) - k[j];
      a[j][0] += d;
      b[j][0] += d * d;
    }
  for (int j = 0; j < P; ++j) {
    s1[j] += combine(a[j]);
    s2[j] += combine(b[j]);
  }
}

// backward's two sums over each of P planes (plane j at offset j * n: consecutive channels of one
// image): sum[j] += sum(g), dotp[j] += sum((x - m[j]) g), g = dy masked where the fused ReLU's
// output was 0 (kMask: !(x * alpha[j] + shift[j] > 0), Note [ReLU mask from the input]; NaN masks
// too), each plane in sum4's order.
template <bool kMask, int P>
__attribute__((always_inline)) inline void backward_planes(const float* __restrict dy, const float* alpha,
                                                           const float* shift, const float* __restrict x, int64_t n,
                                                           const double* m, double* sum, double* dotp) {
  D4 a[P], b[P];
  for (int j = 0; j < P; ++j) a[j] = b[j] = D4{0.0, 0.0, 0.0, 0.0};
  int64_t p = 0;
  for (; p + 4 <= n; p += 4)
    for (int j = 0; j < P; ++j) {
      const int64_t at = j * n + p;
      F4 g, xv;
      std::memcpy(&g, dy + at, sizeof g);
      std::memcpy(&xv, x + at, sizeof xv);
      if (kMask) {
        const I4 keep = xv * alpha[j] + shift[j] > F4{0.f, 0.f, 0.f, 0.f};  // all ones where kept
        I4 bits;
        std::memcpy(&bits, &g, sizeof bits);
        bits &= keep;
        std::memcpy(&g, &bits, sizeof g);
      }
      const D4 gd = __builtin_convertvector(g, D4);
      a[j] += gd;
      b[j] += (__builtin_convertvector(xv, D4) - m[j]) * gd;  // m[j] in every lane
    }
  for (; p < n; ++p)
    for (int j = 0; j < P; ++j) {
      const int64_t at = j * n + p;
      const double g = static_cast<double>(kMask ? (x[at] * alpha[j] + shift[j] > 0.f ? dy[at] : 0.f) : dy[at]);
      a[j][0] += g;
      b[j][0] += (static_cast<double>(x[at]) - m[j]) * g;
    }
  for (int j = 0; j < P; ++j) {
    sum[j] += combine(a[j]);
    dotp[j] += combine(b[j]);
  }
}

// p + c, or nullptr for a nullptr p (the mask's coefficients without a ReLU).
inline const float* offset(const float* p, int64_t c) { return p ? p + c : nullptr; }

// Note [BatchNorm reductions in memory order]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The row kernels sum channel c's planes in order of n (kernels::channel_sum), each plane's sum
// a chain of its own added to the channel's total. Walked channel by channel, that reads one
// plane per image, C planes apart: at ResNet's 4x4 planes one cache line every C * 64 bytes,
// three arrays at once in backward, at half the speed per array of the elementwise passes
// (issue 24's profile: 7% of a ResNet-18 step). Here the images are the outer loop and each
// image's planes are read in memory order, kGroup channels at a time (independent chains the
// CPU overlaps), each plane's sum added to its channel's double total: every total still gets
// its planes in order of n, so the bits are the row kernels'. kGroup = 4 keeps the partials
// (and backward's two sums and the means) within the AVX2 clone's 16 vector registers.
constexpr int kGroup = 4;

// f(group, c) for the channels [0, channels): kGroup at a time, then one at a time.
template <class F>
__attribute__((always_inline)) inline void over_channels(int64_t channels, const F& f) {
  int64_t c = 0;
  for (; c + kGroup <= channels; c += kGroup) f(std::integral_constant<int, kGroup>{}, c);
  for (; c < channels; ++c) f(std::integral_constant<int, 1>{}, c);
}

// Inlined into each clone of batchnorm_backward_reduce (out of line it is built for plain x86-64).
template <bool kMask>
__attribute__((always_inline)) inline void backward_reduce(const kernels::BatchNormBackwardReduce& k, const double* m,
                                                           double* sum, double* dotp) {
  for (int64_t n = 0; n < k.batch; ++n)
    over_channels(k.channels, [&](auto group, int64_t c) {
      const int64_t at = (n * k.channels + c) * k.plane;
      backward_planes<kMask, decltype(group)::value>(k.dy + at, offset(k.relu.alpha, c), offset(k.relu.shift, c),
                                                     k.x + at, k.plane, m + c, sum + c, dotp + c);
    });
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DTRAIN_NORM_AVX2 1

// Note [BatchNorm reductions with AVX2]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The loops above, in AVX2 intrinsics. GCC 12 lowers __builtin_convertvector from four floats
// to four doubles into two halves, inserts and stack round trips (the masked dy went through
// memory too): the backward reduce and the statistics, 7% of a ResNet-18 step (issue 24), ran
// at about half their loads' speed. Here each four floats are one vcvtps2pd into a register.
// The same partial sums in the same order, no FMA (target avx2 only), so the same bits.
template <int P>
[[gnu::target("avx2"), gnu::always_inline]] inline void plane_moments_avx2(const float* __restrict x, int64_t n,
                                                                          const double* k, double* s1, double* s2) {
  __m256d a[P], b[P], kv[P];
  for (int j = 0; j < P; ++j) {
    a[j] = b[j] = _mm256_setzero_pd();
    kv[j] = _mm256_set1_pd(k[j]);
  }
  int64_t p = 0;
  for (; p + 4 <= n; p += 4)
    for (int j = 0; j < P; ++j) {
      const __m256d d = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + j * n + p)), kv[j]);
      a[j] = _mm256_add_pd(a[j], d);
      b[j] = _mm256_add_pd(b[j], _mm256_mul_pd(d, d));
    }
  for (int j = 0; j < P; ++j) {
    alignas(32) double la[4], lb[4];
    _mm256_store_pd(la, a[j]);
    _mm256_store_pd(lb, b[j]);
    for (int64_t q = p; q < n; ++q) {
      const double d = static_cast<double>(x[j * n + q]) - k[j];
      la[0] += d;
      lb[0] += d * d;
    }
    s1[j] += (la[0] + la[1]) + (la[2] + la[3]);
    s2[j] += (lb[0] + lb[1]) + (lb[2] + lb[3]);
  }
}

template <bool kMask, int P>
[[gnu::target("avx2"), gnu::always_inline]] inline void backward_planes_avx2(const float* __restrict dy,
                                                                            const float* alpha, const float* shift,
                                                                            const float* __restrict x, int64_t n,
                                                                            const double* m, double* sum,
                                                                            double* dotp) {
  __m256d a[P], b[P], mv[P];
  __m128 av[P], sv[P];
  for (int j = 0; j < P; ++j) {
    a[j] = b[j] = _mm256_setzero_pd();
    mv[j] = _mm256_set1_pd(m[j]);
    av[j] = _mm_set1_ps(kMask ? alpha[j] : 0.f);
    sv[j] = _mm_set1_ps(kMask ? shift[j] : 0.f);
  }
  int64_t p = 0;
  for (; p + 4 <= n; p += 4)
    for (int j = 0; j < P; ++j) {
      const int64_t at = j * n + p;
      __m128 g = _mm_loadu_ps(dy + at);
      const __m128 xv = _mm_loadu_ps(x + at);
      // Forward's float x * alpha + shift; ordered: a NaN masks, as the scalar > 0 does.
      if (kMask) {
        const __m128 v = _mm_add_ps(_mm_mul_ps(xv, av[j]), sv[j]);
        g = _mm_and_ps(g, _mm_cmp_ps(v, _mm_setzero_ps(), _CMP_GT_OQ));
      }
      const __m256d gd = _mm256_cvtps_pd(g);
      a[j] = _mm256_add_pd(a[j], gd);
      b[j] = _mm256_add_pd(b[j], _mm256_mul_pd(_mm256_sub_pd(_mm256_cvtps_pd(xv), mv[j]), gd));
    }
  for (int j = 0; j < P; ++j) {
    alignas(32) double la[4], lb[4];
    _mm256_store_pd(la, a[j]);
    _mm256_store_pd(lb, b[j]);
    for (int64_t q = p; q < n; ++q) {
      const int64_t at = j * n + q;
      const double g = static_cast<double>(kMask ? (x[at] * alpha[j] + shift[j] > 0.f ? dy[at] : 0.f) : dy[at]);
      la[0] += g;
      lb[0] += (static_cast<double>(x[at]) - m[j]) * g;
    }
    sum[j] += (la[0] + la[1]) + (la[2] + la[3]);
    dotp[j] += (lb[0] + lb[1]) + (lb[2] + lb[3]);
  }
}

// Without lambdas: a lambda's body would not carry the target to inline the intrinsics into.
[[gnu::target("avx2")]] void stats_avx2(const kernels::BatchNormStats& k, const double* shift, double* s1,
                                        double* s2) {
  for (int64_t n = 0; n < k.batch; ++n) {
    int64_t c = 0;
    for (; c + kGroup <= k.channels; c += kGroup)
      plane_moments_avx2<kGroup>(k.x + (n * k.channels + c) * k.plane, k.plane, shift + c, s1 + c, s2 + c);
    for (; c < k.channels; ++c)
      plane_moments_avx2<1>(k.x + (n * k.channels + c) * k.plane, k.plane, shift + c, s1 + c, s2 + c);
  }
}

template <bool kMask>
[[gnu::target("avx2")]] void backward_reduce_avx2(const kernels::BatchNormBackwardReduce& k, const double* m,
                                                  double* sum, double* dotp) {
  for (int64_t n = 0; n < k.batch; ++n) {
    int64_t c = 0;
    for (; c + kGroup <= k.channels; c += kGroup) {
      const int64_t at = (n * k.channels + c) * k.plane;
      backward_planes_avx2<kMask, kGroup>(k.dy + at, offset(k.relu.alpha, c), offset(k.relu.shift, c), k.x + at,
                                          k.plane, m + c, sum + c, dotp + c);
    }
    for (; c < k.channels; ++c) {
      const int64_t at = (n * k.channels + c) * k.plane;
      backward_planes_avx2<kMask, 1>(k.dy + at, offset(k.relu.alpha, c), offset(k.relu.shift, c), k.x + at, k.plane,
                                     m + c, sum + c, dotp + c);
    }
  }
}
#endif

// Which loops run: AVX2's where the CPU has it (tests: select_norm_isa).
bool& use_avx2() {
#ifdef DTRAIN_NORM_AVX2
  static bool on = __builtin_cpu_supports("avx2");
#else
  static bool on = false;
#endif
  return on;
}

}  // namespace

DTRAIN_CPU_CLONES void batchnorm_stats(const kernels::BatchNormStats& k) {
  const double count = static_cast<double>(k.batch * k.plane);
  const int64_t channels = k.channels;
  std::vector<double> acc(3 * static_cast<size_t>(channels), 0.0);  // [shifts, s1, s2]
  double* shift = acc.data();
  double* s1 = shift + channels;
  double* s2 = s1 + channels;
  if (count > 0.0)
    for (int64_t c = 0; c < channels; ++c) shift[c] = k.x[c * k.plane];  // image 0's first value
#ifdef DTRAIN_NORM_AVX2
  if (use_avx2())
    stats_avx2(k, shift, s1, s2);
  else
#endif
    for (int64_t n = 0; n < k.batch; ++n)
      over_channels(channels, [&](auto group, int64_t c) {
        plane_moments<decltype(group)::value>(k.x + (n * channels + c) * k.plane, k.plane, shift + c, s1 + c, s2 + c);
      });
  for (int64_t c = 0; c < channels; ++c)
    k.finish(c, shift[c] + s1[c] / count, kernels::BatchNormStats::shifted_squares(s1[c], s2[c], count));
}

DTRAIN_CPU_CLONES void batchnorm_backward_reduce(const kernels::BatchNormBackwardReduce& k) {
  const int64_t channels = k.channels;
  std::vector<double> acc(3 * static_cast<size_t>(channels), 0.0);  // [means, sums, dotps]
  double* m = acc.data();
  double* sum = m + channels;
  double* dotp = sum + channels;
  for (int64_t c = 0; c < channels; ++c) m[c] = k.mean[c];
#ifdef DTRAIN_NORM_AVX2
  if (use_avx2()) {
    if (k.relu.on())
      backward_reduce_avx2<true>(k, m, sum, dotp);
    else
      backward_reduce_avx2<false>(k, m, sum, dotp);
  } else
#endif
  {
    if (k.relu.on())
      backward_reduce<true>(k, m, sum, dotp);
    else
      backward_reduce<false>(k, m, sum, dotp);
  }
  for (int64_t c = 0; c < channels; ++c) k.finish(c, sum[c], dotp[c]);
}

const char* norm_isa() { return use_avx2() ? "avx2" : "generic"; }

bool select_norm_isa(std::string_view name) {
#ifdef DTRAIN_NORM_AVX2
  const bool has_avx2 = __builtin_cpu_supports("avx2");
#else
  const bool has_avx2 = false;
#endif
  if (name == "generic" || (name.empty() && !has_avx2)) {
    use_avx2() = false;
    return true;
  }
  if ((name == "avx2" || name.empty()) && has_avx2) {
    use_avx2() = true;
    return true;
  }
  return false;
}

}  // namespace dtrain::cpu
