// The CPU loops of model/cpu_norm.h. Each plane is summed as kernels::sum4 sums it: four
// interleaved partial sums (element p into partial p % 4, the tail into the first), combined as
// (s0 + s1) + (s2 + s3), and the planes added in order of n into the channel's double sum.
// The partials are an array the compiler keeps in one vector register (AVX2: four doubles);
// no FMA (Note on DTRAIN_CPU_CLONES in core/launch.h), so every clone gives the same bits.
#include "model/cpu_norm.h"

#include <cstring>
#include <type_traits>

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
inline double combine(D4 s) { return (s[0] + s[1]) + (s[2] + s[3]); }

// total += the sum of double(x[p]) - shift, squared when kSquare, over each of P planes in
// turn (plane j at x + j * stride), each plane in sum4's order. The P planes' partial sums are
// independent chains, so the CPU overlaps their additions; the totals are added in plane order.
template <bool kSquare, int P>
inline void plane_sums(const float* __restrict x, int64_t stride, int64_t n, double shift, double& total) {
  D4 s[P];
  for (int j = 0; j < P; ++j) s[j] = D4{0.0, 0.0, 0.0, 0.0};
  const D4 shift4 = {shift, shift, shift, shift};
  int64_t p = 0;
  for (; p + 4 <= n; p += 4)
    for (int j = 0; j < P; ++j) {
      const D4 d = load4(x + j * stride + p) - shift4;
      s[j] += kSquare ? d * d : d;
    }
  for (; p < n; ++p)
    for (int j = 0; j < P; ++j) {
      const double d = static_cast<double>(x[j * stride + p]) - shift;
      s[j][0] += kSquare ? d * d : d;
    }
  for (int j = 0; j < P; ++j) total += combine(s[j]);
}

// backward's two sums over each of P planes in turn (plane j at offset j * stride): sum +=
// sum(g), dotp += sum((x - m) g), g = dy masked where y <= 0 (kMask: the fused ReLU's output;
// NaN masks too), each plane in sum4's order, the planes added in order.
template <bool kMask, int P>
inline void backward_planes(const float* __restrict dy, const float* __restrict y, const float* __restrict x,
                            int64_t stride, double m, int64_t n, double& sum, double& dotp) {
  D4 a[P], b[P];
  for (int j = 0; j < P; ++j) a[j] = b[j] = D4{0.0, 0.0, 0.0, 0.0};
  const D4 m4 = {m, m, m, m};
  int64_t p = 0;
  for (; p + 4 <= n; p += 4)
    for (int j = 0; j < P; ++j) {
      const int64_t at = j * stride + p;
      F4 g;
      std::memcpy(&g, dy + at, sizeof g);
      if (kMask) {
        F4 yv;
        std::memcpy(&yv, y + at, sizeof yv);
        const I4 keep = yv > F4{0.f, 0.f, 0.f, 0.f};  // all ones where y > 0
        I4 bits;
        std::memcpy(&bits, &g, sizeof bits);
        bits &= keep;
        std::memcpy(&g, &bits, sizeof g);
      }
      const D4 gd = __builtin_convertvector(g, D4);
      a[j] += gd;
      b[j] += (load4(x + at) - m4) * gd;
    }
  for (; p < n; ++p)
    for (int j = 0; j < P; ++j) {
      const int64_t at = j * stride + p;
      const double g = static_cast<double>(kMask ? (y[at] > 0.f ? dy[at] : 0.f) : dy[at]);
      a[j][0] += g;
      b[j][0] += (static_cast<double>(x[at]) - m) * g;
    }
  for (int j = 0; j < P; ++j) {
    sum += combine(a[j]);
    dotp += combine(b[j]);
  }
}

// The planes of channel c, two at a time (kernels::channel_sum's order: n ascending).
template <class Two, class One>
inline void over_planes(int64_t batch, const Two& two, const One& one) {
  int64_t n = 0;
  for (; n + 2 <= batch; n += 2) two(n);
  for (; n < batch; ++n) one(n);
}

// Inlined into each clone of batchnorm_backward_reduce (out of line it is built for plain x86-64).
template <bool kMask>
__attribute__((always_inline)) inline void backward_reduce(const kernels::BatchNormBackwardReduce& k) {
  const int64_t stride = k.channels * k.plane;
  for (int64_t c = 0; c < k.channels; ++c) {
    const double m = k.mean[c];
    double sum = 0.0, dotp = 0.0;
    auto planes = [&](auto count, int64_t n) {
      const int64_t at = n * stride + c * k.plane;
      backward_planes<kMask, decltype(count)::value>(k.dy + at, kMask ? k.y + at : nullptr, k.x + at, stride, m,
                                                     k.plane, sum, dotp);
    };
    over_planes(
        k.batch, [&](int64_t n) { planes(std::integral_constant<int, 2>{}, n); },
        [&](int64_t n) { planes(std::integral_constant<int, 1>{}, n); });
    k.finish(c, sum, dotp);
  }
}

}  // namespace

DTRAIN_CPU_CLONES void batchnorm_stats(const kernels::BatchNormStats& k) {
  const double count = static_cast<double>(k.batch * k.plane);
  const int64_t stride = k.channels * k.plane;
  for (int64_t c = 0; c < k.channels; ++c) {
    const float* xc = k.x + c * k.plane;
    double s = 0.0;
    over_planes(
        k.batch, [&](int64_t n) { plane_sums<false, 2>(xc + n * stride, stride, k.plane, 0.0, s); },
        [&](int64_t n) { plane_sums<false, 1>(xc + n * stride, stride, k.plane, 0.0, s); });
    const double m = s / count;
    double squares = 0.0;
    over_planes(
        k.batch, [&](int64_t n) { plane_sums<true, 2>(xc + n * stride, stride, k.plane, m, squares); },
        [&](int64_t n) { plane_sums<true, 1>(xc + n * stride, stride, k.plane, m, squares); });
    k.finish(c, m, squares);
  }
}

DTRAIN_CPU_CLONES void batchnorm_backward_reduce(const kernels::BatchNormBackwardReduce& k) {
  if (k.y)
    backward_reduce<true>(k);
  else
    backward_reduce<false>(k);
}

}  // namespace dtrain::cpu
