// The CPU loops of model/cpu_norm.h. Each plane is summed as kernels::sum4 sums it: four
// interleaved partial sums (element p into partial p % 4, the tail into the first), combined as
// (s0 + s1) + (s2 + s3), and the planes added in order of n into the channel's double sum.
// The partials are an array the compiler keeps in one vector register (AVX2: four doubles);
// no FMA (Note on DTRAIN_CPU_CLONES in core/launch.h), so every clone gives the same bits.
#include "model/cpu_norm.h"

#include <cstring>

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

// The sum of double(x[p]) - shift, squared when `square`, over one plane (sum4's order).
template <bool kSquare>
inline double plane_sum(const float* __restrict x, int64_t n, double shift) {
  D4 s = {0.0, 0.0, 0.0, 0.0};
  const D4 shift4 = {shift, shift, shift, shift};
  int64_t p = 0;
  for (; p + 4 <= n; p += 4) {
    const D4 d = load4(x + p) - shift4;
    s += kSquare ? d * d : d;
  }
  for (; p < n; ++p) {
    const double d = static_cast<double>(x[p]) - shift;
    s[0] += kSquare ? d * d : d;
  }
  return combine(s);
}

// One plane of backward: sum += sum(g), dotp += sum((x - m) g), g = dy masked where y <= 0
// (kMask: the fused ReLU's output; NaN masks too), both in sum4's order.
template <bool kMask>
inline void backward_plane(const float* __restrict dy, const float* __restrict y, const float* __restrict x, double m,
                           int64_t n, double& sum, double& dotp) {
  D4 a = {0.0, 0.0, 0.0, 0.0}, b = {0.0, 0.0, 0.0, 0.0};
  const D4 m4 = {m, m, m, m};
  int64_t p = 0;
  for (; p + 4 <= n; p += 4) {
    F4 g;
    std::memcpy(&g, dy + p, sizeof g);
    if (kMask) {
      F4 yv;
      std::memcpy(&yv, y + p, sizeof yv);
      const I4 keep = yv > F4{0.f, 0.f, 0.f, 0.f};  // all ones where y > 0
      I4 bits;
      std::memcpy(&bits, &g, sizeof bits);
      bits &= keep;
      std::memcpy(&g, &bits, sizeof g);
    }
    const D4 gd = __builtin_convertvector(g, D4);
    a += gd;
    b += (load4(x + p) - m4) * gd;
  }
  for (; p < n; ++p) {
    const double g = static_cast<double>(kMask ? (y[p] > 0.f ? dy[p] : 0.f) : dy[p]);
    a[0] += g;
    b[0] += (static_cast<double>(x[p]) - m) * g;
  }
  sum += combine(a);
  dotp += combine(b);
}

template <bool kMask>
inline void backward_reduce(const kernels::BatchNormBackwardReduce& k) {
  for (int64_t c = 0; c < k.channels; ++c) {
    const double m = k.mean[c];
    double sum = 0.0, dotp = 0.0;
    for (int64_t n = 0; n < k.batch; ++n) {
      const int64_t at = (n * k.channels + c) * k.plane;
      backward_plane<kMask>(k.dy + at, kMask ? k.y + at : nullptr, k.x + at, m, k.plane, sum, dotp);
    }
    k.finish(c, sum, dotp);
  }
}

}  // namespace

DTRAIN_CPU_CLONES void batchnorm_stats(const kernels::BatchNormStats& k) {
  const double count = static_cast<double>(k.batch * k.plane);
  for (int64_t c = 0; c < k.channels; ++c) {
    double s = 0.0;
    for (int64_t n = 0; n < k.batch; ++n) s += plane_sum<false>(k.x + (n * k.channels + c) * k.plane, k.plane, 0.0);
    const double m = s / count;
    double squares = 0.0;
    for (int64_t n = 0; n < k.batch; ++n) squares += plane_sum<true>(k.x + (n * k.channels + c) * k.plane, k.plane, m);
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
