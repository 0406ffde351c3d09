// The direct convolution kernels of model/cpu_direct_conv.h.
//
// Note [Direct CPU convolution]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// ResNet-18 at width 16 on 28x28 images runs its 3x3 convolutions with 16-32 channels on 28x28
// and 14x14 planes. There im2col + GEMM (Note [Chunked CPU convolution]) copies each input
// element into 9 columns that the GEMM then reads with only out_c = 16-32 rows to reuse them:
// issue 24's profile had im2col, col2im and the moves around the GEMM at 28% of a step beside
// the GEMM kernel's 41%, and the skinny GEMMs themselves below the sgemm rate. These kernels
// read the input where it lies instead:
// - Each image's planes are copied once into a zero-bordered plane of (h+2) rows of pitch
//   wp = w+2 (plus zero slack). Output pixel q = oy*wp + ox of that pitch (ox >= w: two wasted
//   columns a row, 7% at 28x28) reads tap (ky, kx) at q + ky*wp + kx: every tap of every
//   output is a contiguous, unaligned vector load, with no edge cases.
// - Forward: a register tile of CB output channels x NV vectors of pixels accumulates over the
//   input channels and the 9 taps (per tap NV loads, CB broadcast weights, CB*NV FMAs; weights
//   packed [channel block][in channel][tap][CB]); the tile is then written to a pitch-wp scratch
//   and moved to NCHW with the bias and the fused ReLU.
// - Input gradient: the same kernel on the padded dY (masked by the fused ReLU's output) with
//   the weights transposed and flipped: dX[ci] = sum_co W[co, ci, 2-ky, 2-kx] dY[co] shifted.
// - Weight gradient: dW[co, ci, tap] = sum_q dY[co, q] X[ci, q + tap's offset], with dY read in
//   the same padded planes (its wasted columns fall on the zero border), CBW output channels x
//   9 taps of vector accumulators over a chunk of images, summed across lanes once per chunk.
// Vectors are GCC vector extensions; the kernels are compiled three times (AVX-512: 16 floats,
// 8x3 forward tile, 2 channels x 9 taps for dW; AVX2 + FMA: 8 floats, 4x3, 1x9; SSE2: 4 floats)
// and picked by the CPU at the first call (direct_conv_isa). This file is built with
// -ffp-contract=fast, so the vector a*b+c are FMAs: the sums are not im2col + GEMM's sums, and
// differ between the three builds (as OpenBLAS's differ between its core types), but a run on
// one machine is bitwise repeatable: no order depends on the thread count or the data.
// Smaller planes (7x7, 4x4), strided and other kernels stay on im2col + GEMM: there the GEMMs
// have 64-128 rows to reuse each column, and the padded pitch would waste a third or more of
// each vector.
#include "model/cpu_direct_conv.h"

#include <algorithm>
#include <cstring>
#include <string_view>
#include <vector>

namespace dtrain::cpu {

namespace {

constexpr int64_t kTaps = 9;
constexpr int64_t kTile = 48;       // pixels a row of every build's forward tile divides
constexpr int64_t kChannelPad = 8;  // output channels padded to every build's CB
constexpr int64_t kChunkBytes = int64_t{512} << 10;

int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

// The padded layout of one geometry (Note [Direct CPU convolution]).
struct Layout {
  int64_t h, w, wp, q, qr, sp;
  int64_t off[kTaps];
  explicit Layout(const kernels::ConvGeometry& g) : h(g.h), w(g.w), wp(g.w + 2) {
    q = h * wp;                             // output pixels in pitch wp
    qr = round_up(q, kTile);                // ... rounded up to whole tiles
    sp = round_up((h + 2) * wp + kTile + 2, 16);  // a padded plane with the slack the tiles read
    for (int64_t t = 0; t < kTaps; ++t) off[t] = (t / 3) * wp + t % 3;
  }
};

int64_t chunk_images(const DirectConv& d, const Layout& l) {
  const int64_t per_image = (d.g.c + d.out_c) * l.sp * static_cast<int64_t>(sizeof(float));
  return std::clamp<int64_t>(kChunkBytes / per_image, 1, std::max<int64_t>(1, d.batch));
}

struct Scratch {
  float *xpad, *dypad, *wpack, *out;
};
Scratch carve(const DirectConv& d, const Layout& l, float* s) {
  const int64_t nb = chunk_images(d, l), cin = d.g.c, cout = d.out_c;
  Scratch r{};
  r.xpad = s;
  r.dypad = r.xpad + nb * cin * l.sp;
  r.wpack = r.dypad + nb * cout * l.sp;
  r.out = r.wpack + std::max(round_up(cout, kChannelPad) * cin, round_up(cin, kChannelPad) * cout) * kTaps;
  return r;
}

// dst: `planes` padded planes of src's [h, w] planes, zero borders and slack; with mask, each
// element zeroed where mask <= 0 (the fused ReLU's gradient).
void pad_planes(const float* __restrict src, const float* __restrict mask, int64_t planes, const Layout& l,
                float* __restrict dst) {
  for (int64_t p = 0; p < planes; ++p) {
    const float* s = src + p * l.h * l.w;
    const float* m = mask ? mask + p * l.h * l.w : nullptr;
    float* o = dst + p * l.sp;
    std::memset(o, 0, sizeof(float) * static_cast<size_t>(l.wp + 1));
    for (int64_t y = 0; y < l.h; ++y) {
      float* row = o + (y + 1) * l.wp + 1;
      const float* sr = s + y * l.w;
      if (m) {
        const float* mr = m + y * l.w;
        for (int64_t x = 0; x < l.w; ++x) row[x] = mr[x] > 0.f ? sr[x] : 0.f;
      } else {
        std::memcpy(row, sr, sizeof(float) * static_cast<size_t>(l.w));
      }
      row[l.w] = 0.f;  // this row's right border
      row[l.w + 1] = 0.f;  // the next row's left border
    }
    const int64_t tail = (l.h + 1) * l.wp + 1;
    std::memset(o + tail, 0, sizeof(float) * static_cast<size_t>(l.sp - tail));
  }
}

// Sum of a padded plane in 8 lanes (the borders add +0), lanes added last.
float plane_sum(const float* x, int64_t n) {
  float lanes[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) lanes[j] += x[i + j];
  for (; i < n; ++i) lanes[0] += x[i];
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

// y[c, oy, ox] = t[c, oy*wp + ox] (+ bias[c], then max(., 0) when relu) for `channels` planes.
void unpad_planes(const float* __restrict t, const float* bias, bool relu, int64_t channels, const Layout& l,
                  float* __restrict y) {
  for (int64_t c = 0; c < channels; ++c) {
    const float b = bias ? bias[c] : 0.f;
    for (int64_t oy = 0; oy < l.h; ++oy) {
      const float* src = t + c * l.qr + oy * l.wp;
      float* dst = y + (c * l.h + oy) * l.w;
      if (relu) {
        for (int64_t ox = 0; ox < l.w; ++ox) {
          const float v = src[ox] + b;
          dst[ox] = v > 0.f ? v : 0.f;
        }
      } else if (bias) {
        for (int64_t ox = 0; ox < l.w; ++ox) dst[ox] = src[ox] + b;
      } else {
        std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(l.w));
      }
    }
  }
}

// wpk[block][ci][tap][CB] = w[block*CB + j, ci, tap] (forward) or, for the input gradient
// (transposed: the planes convolved are dY's, the outputs dX's), w[co, block*CB + j, 8 - tap];
// channels past the last are zero.
void pack_weights(const float* w, int64_t out_c, int64_t in_c, bool transposed, int64_t cb, float* wpk) {
  const int64_t outs = transposed ? in_c : out_c, ins = transposed ? out_c : in_c;
  for (int64_t o0 = 0; o0 < round_up(outs, cb); o0 += cb)
    for (int64_t i = 0; i < ins; ++i)
      for (int64_t t = 0; t < kTaps; ++t)
        for (int64_t j = 0; j < cb; ++j) {
          const int64_t o = o0 + j;
          float v = 0.f;
          if (o < outs) v = transposed ? w[(i * in_c + o) * kTaps + (kTaps - 1 - t)] : w[(o * in_c + i) * kTaps + t];
          wpk[((o0 * ins) + i * cb) * kTaps + t * cb + j] = v;
        }
}

template <int V>
using Vec [[gnu::vector_size(V * sizeof(float))]] = float;

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

// out[o, q] for o < outs (rounded up to CB), q < qr: sum over the `ins` padded planes `in` and
// the taps of wpk's weights times in[i, q + off[tap]].
template <int V, int CB, int NV>
[[gnu::always_inline]] inline void conv_planes(const float* __restrict in, int64_t ins, const Layout& l,
                                               const float* __restrict wpk, int64_t outs, float* __restrict out) {
  for (int64_t o0 = 0; o0 < outs; o0 += CB) {
    const float* wb = wpk + o0 * ins * kTaps;
    for (int64_t q0 = 0; q0 < l.qr; q0 += V * NV) {
      Vec<V> acc[CB][NV] = {};
      for (int64_t i = 0; i < ins; ++i) {
        const float* ip = in + i * l.sp + q0;
        const float* wi = wb + i * kTaps * CB;
#pragma GCC unroll 9
        for (int t = 0; t < kTaps; ++t) {
          Vec<V> xv[NV];
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) load<V>(xv[v], ip + l.off[t] + v * V);
#pragma GCC unroll 8
          for (int j = 0; j < CB; ++j) {
            const float s = wi[t * CB + j];
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) acc[j][v] += xv[v] * s;
          }
        }
      }
#pragma GCC unroll 8
      for (int j = 0; j < CB; ++j)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) store<V>(out + (o0 + j) * l.qr + q0 + v * V, acc[j][v]);
    }
  }
}

template <int V>
[[gnu::always_inline]] inline float lanes_sum(const Vec<V>& v) {
  float s = 0.f;
#pragma GCC unroll 16
  for (int i = 0; i < V; ++i) s += v[i];
  return s;
}

// dw[co0 + j, ci, tap] (+)= sum over the chunk's nb images and q < qr of dy[n, co0 + j, q]
// X[n, ci, q + off[tap]], for j < CBW; dy's planes are read from their interior's first pixel.
template <int V, int CBW>
[[gnu::always_inline]] inline void weight_grad_block(const float* __restrict xpad, const float* __restrict dypad,
                                                     int64_t nb, int64_t cin, int64_t cout, int64_t co0, int64_t ci,
                                                     const Layout& l, bool overwrite, float* __restrict dw) {
  Vec<V> acc[CBW][kTaps] = {};
  for (int64_t n = 0; n < nb; ++n) {
    const float* xp = xpad + (n * cin + ci) * l.sp;
    const float* dp = dypad + (n * cout + co0) * l.sp + l.wp + 1;
    for (int64_t q = 0; q < l.qr; q += V) {
      Vec<V> g[CBW];
#pragma GCC unroll 4
      for (int j = 0; j < CBW; ++j) load<V>(g[j], dp + j * l.sp + q);
#pragma GCC unroll 9
      for (int t = 0; t < kTaps; ++t) {
        Vec<V> xv;
        load<V>(xv, xp + q + l.off[t]);
#pragma GCC unroll 4
        for (int j = 0; j < CBW; ++j) acc[j][t] += g[j] * xv;
      }
    }
  }
  for (int j = 0; j < CBW; ++j)
    for (int t = 0; t < kTaps; ++t) {
      float& d = dw[((co0 + j) * cin + ci) * kTaps + t];
      const float s = lanes_sum<V>(acc[j][t]);
      d = overwrite ? s : d + s;
    }
}

template <int V, int CB, int NV>
[[gnu::always_inline]] inline void forward_impl(const DirectConv& d, const float* x, const float* w, const float* bias,
                                                bool relu, float* y, float* scratch) {
  const Layout l(d.g);
  const Scratch s = carve(d, l, scratch);
  const int64_t cin = d.g.c, cout = d.out_c;
  pack_weights(w, cout, cin, false, CB, s.wpack);
  for (int64_t n = 0; n < d.batch; ++n) {
    pad_planes(x + n * cin * l.h * l.w, nullptr, cin, l, s.xpad);
    conv_planes<V, CB, NV>(s.xpad, cin, l, s.wpack, cout, s.out);
    unpad_planes(s.out, bias, relu, cout, l, y + n * cout * l.h * l.w);
  }
}

template <int V, int CB, int NV, int CBW>
[[gnu::always_inline]] inline void backward_impl(const DirectConv& d, const float* x, const float* w, const float* dy,
                                                 const float* relu_output, float* dx, float* dw, float dw_beta,
                                                 float* db, float db_beta, float* scratch) {
  const Layout l(d.g);
  const Scratch s = carve(d, l, scratch);
  const int64_t cin = d.g.c, cout = d.out_c, in_size = cin * l.h * l.w, out_size = cout * l.h * l.w;
  const int64_t chunk = chunk_images(d, l);
  if (dx) pack_weights(w, cout, cin, true, CB, s.wpack);
  // A batch of 0 still writes the gradients (beta 0) as the GEMM path does.
  if (d.batch == 0) {
    if (dw_beta == 0.f) std::fill(dw, dw + cout * cin * kTaps, 0.f);
    if (db && db_beta == 0.f) std::fill(db, db + cout, 0.f);
  }
  for (int64_t n0 = 0; n0 < d.batch; n0 += chunk) {
    const int64_t nb = std::min(chunk, d.batch - n0);
    const bool first = n0 == 0;
    pad_planes(x + n0 * in_size, nullptr, nb * cin, l, s.xpad);
    pad_planes(dy + n0 * out_size, relu_output ? relu_output + n0 * out_size : nullptr, nb * cout, l, s.dypad);
    if (db)
      for (int64_t co = 0; co < cout; ++co) {
        float total = 0.f;
        for (int64_t n = 0; n < nb; ++n) total += plane_sum(s.dypad + (n * cout + co) * l.sp, l.sp);
        db[co] = first && db_beta == 0.f ? total : db[co] + total;  // not beta * db: stale memory may hold NaN
      }
    const bool overwrite = first && dw_beta == 0.f;
    int64_t co0 = 0;
    for (; co0 + CBW <= cout; co0 += CBW)
      for (int64_t ci = 0; ci < cin; ++ci)
        weight_grad_block<V, CBW>(s.xpad, s.dypad, nb, cin, cout, co0, ci, l, overwrite, dw);
    for (; co0 < cout; ++co0)
      for (int64_t ci = 0; ci < cin; ++ci)
        weight_grad_block<V, 1>(s.xpad, s.dypad, nb, cin, cout, co0, ci, l, overwrite, dw);
    if (!dx) continue;
    for (int64_t n = 0; n < nb; ++n) {
      conv_planes<V, CB, NV>(s.dypad + n * cout * l.sp, cout, l, s.wpack, cin, s.out);
      unpad_planes(s.out, nullptr, false, cin, l, dx + (n0 + n) * in_size);
    }
  }
}

using ForwardFn = void (*)(const DirectConv&, const float*, const float*, const float*, bool, float*, float*);
using BackwardFn = void (*)(const DirectConv&, const float*, const float*, const float*, const float*, float*, float*,
                            float, float*, float, float*);
struct Impl {
  ForwardFn forward;
  BackwardFn backward;
  const char* name;
};

#define DTRAIN_DIRECT_CONV_IMPL(NAME, TARGET, V, CB, NV, CBW)                                                   \
  TARGET void forward_##NAME(const DirectConv& d, const float* x, const float* w, const float* bias, bool relu,  \
                             float* y, float* scratch) {                                                         \
    forward_impl<V, CB, NV>(d, x, w, bias, relu, y, scratch);                                                    \
  }                                                                                                              \
  TARGET void backward_##NAME(const DirectConv& d, const float* x, const float* w, const float* dy,             \
                              const float* relu_output, float* dx, float* dw, float dw_beta, float* db,          \
                              float db_beta, float* scratch) {                                                   \
    backward_impl<V, CB, NV, CBW>(d, x, w, dy, relu_output, dx, dw, dw_beta, db, db_beta, scratch);             \
  }

DTRAIN_DIRECT_CONV_IMPL(generic, , 4, 4, 2, 1)
#if defined(__x86_64__) && defined(__GNUC__)
DTRAIN_DIRECT_CONV_IMPL(avx2, __attribute__((target("avx2,fma"))), 8, 4, 3, 1)
DTRAIN_DIRECT_CONV_IMPL(avx512, __attribute__((target("avx512f,avx512vl,avx2,fma"))), 16, 8, 3, 2)
#endif
#undef DTRAIN_DIRECT_CONV_IMPL

// The builds this CPU runs, best first.
std::vector<Impl> supported() {
  std::vector<Impl> r;
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) r.push_back({forward_avx512, backward_avx512, "avx512"});
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) r.push_back({forward_avx2, backward_avx2, "avx2"});
#endif
  r.push_back({forward_generic, backward_generic, "generic"});
  return r;
}

Impl& impl() {
  static Impl chosen = supported().front();
  return chosen;
}

}  // namespace

bool direct_conv_fits(const kernels::ConvGeometry& g) {
  return g.kh == 3 && g.kw == 3 && g.stride == 1 && g.pad == 1 && g.oh == g.h && g.ow == g.w &&
         g.w >= kDirectConvMinWidth;
}

int64_t direct_conv_scratch_floats(const DirectConv& d) {
  const Layout l(d.g);
  const int64_t nb = chunk_images(d, l), cin = d.g.c, cout = d.out_c;
  return nb * (cin + cout) * l.sp +
         std::max(round_up(cout, kChannelPad) * cin, round_up(cin, kChannelPad) * cout) * kTaps +
         std::max(round_up(cout, kChannelPad), round_up(cin, kChannelPad)) * l.qr;
}

void direct_conv_forward(const DirectConv& d, const float* x, const float* w, const float* bias, bool relu, float* y,
                         float* scratch) {
  impl().forward(d, x, w, bias, relu, y, scratch);
}

void direct_conv_backward(const DirectConv& d, const float* x, const float* w, const float* dy,
                          const float* relu_output, float* dx, float* dw, float dw_beta, float* db, float db_beta,
                          float* scratch) {
  impl().backward(d, x, w, dy, relu_output, dx, dw, dw_beta, db, db_beta, scratch);
}

const char* direct_conv_isa() { return impl().name; }

bool select_direct_conv_isa(std::string_view name) {
  for (const Impl& i : supported())
    if (name.empty() || name == i.name) {
      impl() = i;
      return true;
    }
  return false;
}

}  // namespace dtrain::cpu
