// The CPU loops of model/cpu_norm.h. Each plane is summed as kernels::sum4 sums it: four
// interleaved partial sums (element p into partial p % 4, the tail into the first), combined as
// (s0 + s1) + (s2 + s3), and the planes added in order of n into the channel's double sum.
// The partials are an array the compiler keeps in one vector register (AVX2: four doubles);
// no FMA (Note on DTRAIN_CPU_CLONES in core/launch.h), so every clone gives the same bits.
#include "model/cpu_norm.h"

#include <cstring>
#include <type_traits>
#include <vector>

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

// total[j] += the sum of double(x[p]) - shift[j] (kSquare: squared; otherwise shift unused),
// over each of P planes (plane j at x + j * n: consecutive channels of one image), each plane in
// sum4's order. The P planes' partial sums are independent chains, so the CPU overlaps their
// additions.
template <bool kSquare, int P>
__attribute__((always_inline)) inline void plane_sums(const float* __restrict x, int64_t n, const double* shift,
                                                      double* total) {
  D4 s[P];
  for (int j = 0; j < P; ++j) s[j] = D4{0.0, 0.0, 0.0, 0.0};
  int64_t p = 0;
  for (; p + 4 <= n; p += 4)
    for (int j = 0; j < P; ++j) {
      if (kSquare) {
        const D4 d = load4(x + j * n + p) - shift[j];  // shift[j] in every lane
        s[j] += d * d;
      } else {
        s[j] += load4(x + j * n + p);
      }
    }
  for (; p < n; ++p)
    for (int j = 0; j < P; ++j) {
      const double d = kSquare ? static_cast<double>(x[j * n + p]) - shift[j] : static_cast<double>(x[j * n + p]);
      s[j][0] += kSquare ? d * d : d;
    }
  for (int j = 0; j < P; ++j) total[j] += combine(s[j]);
}

// backward's two sums over each of P planes (plane j at offset j * n: consecutive channels of one
// image): sum[j] += sum(g), dotp[j] += sum((x - m[j]) g), g = dy masked where y <= 0 (kMask: the
// fused ReLU's output; NaN masks too), each plane in sum4's order.
template <bool kMask, int P>
__attribute__((always_inline)) inline void backward_planes(const float* __restrict dy, const float* __restrict y,
                                                           const float* __restrict x, int64_t n, const double* m,
                                                           double* sum, double* dotp) {
  D4 a[P], b[P];
  for (int j = 0; j < P; ++j) a[j] = b[j] = D4{0.0, 0.0, 0.0, 0.0};
  int64_t p = 0;
  for (; p + 4 <= n; p += 4)
    for (int j = 0; j < P; ++j) {
      const int64_t at = j * n + p;
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
      b[j] += (load4(x + at) - m[j]) * gd;  // m[j] in every lane
    }
  for (; p < n; ++p)
    for (int j = 0; j < P; ++j) {
      const int64_t at = j * n + p;
      const double g = static_cast<double>(kMask ? (y[at] > 0.f ? dy[at] : 0.f) : dy[at]);
      a[j][0] += g;
      b[j][0] += (static_cast<double>(x[at]) - m[j]) * g;
    }
  for (int j = 0; j < P; ++j) {
    sum[j] += combine(a[j]);
    dotp[j] += combine(b[j]);
  }
}

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
__attribute__((always_inline)) inline void backward_reduce(const kernels::BatchNormBackwardReduce& k) {
  const int64_t channels = k.channels;
  std::vector<double> acc(3 * static_cast<size_t>(channels), 0.0);  // [means, sums, dotps]
  double* m = acc.data();
  double* sum = m + channels;
  double* dotp = sum + channels;
  for (int64_t c = 0; c < channels; ++c) m[c] = k.mean[c];
  for (int64_t n = 0; n < k.batch; ++n)
    over_channels(channels, [&](auto group, int64_t c) {
      const int64_t at = (n * channels + c) * k.plane;
      backward_planes<kMask, decltype(group)::value>(k.dy + at, kMask ? k.y + at : nullptr, k.x + at, k.plane,
                                                     m + c, sum + c, dotp + c);
    });
  for (int64_t c = 0; c < channels; ++c) k.finish(c, sum[c], dotp[c]);
}

}  // namespace

DTRAIN_CPU_CLONES void batchnorm_stats(const kernels::BatchNormStats& k) {
  const double count = static_cast<double>(k.batch * k.plane);
  const int64_t channels = k.channels;
  std::vector<double> acc(2 * static_cast<size_t>(channels), 0.0);  // [sums, then means; squares]
  double* m = acc.data();
  double* squares = m + channels;
  for (int64_t n = 0; n < k.batch; ++n)
    over_channels(channels, [&](auto group, int64_t c) {
      plane_sums<false, decltype(group)::value>(k.x + (n * channels + c) * k.plane, k.plane, nullptr, m + c);
    });
  for (int64_t c = 0; c < channels; ++c) m[c] /= count;
  for (int64_t n = 0; n < k.batch; ++n)
    over_channels(channels, [&](auto group, int64_t c) {
      plane_sums<true, decltype(group)::value>(k.x + (n * channels + c) * k.plane, k.plane, m + c, squares + c);
    });
  for (int64_t c = 0; c < channels; ++c) k.finish(c, m[c], squares[c]);
}

DTRAIN_CPU_CLONES void batchnorm_backward_reduce(const kernels::BatchNormBackwardReduce& k) {
  if (k.y)
    backward_reduce<true>(k);
  else
    backward_reduce<false>(k);
}

}  // namespace dtrain::cpu
