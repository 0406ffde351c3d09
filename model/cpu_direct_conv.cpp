// The direct convolution kernels of model/cpu_direct_conv.h.
//
// Note [Direct CPU convolution]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// ResNet-18 at width 16 on 28x28 images runs 3x3 convolutions with 16-128 channels on 28x28
// down to 4x4 planes. There im2col + GEMM (Note [Chunked CPU convolution]) copies each input
// element into 9 columns that the GEMM then reads with only out_c = 16-32 rows to reuse them
// in the wide layers: issue 24's profile had im2col, col2im and the moves around the GEMM at
// 28% of a step beside the GEMM kernel's 41%. These kernels read the input where it lies:
// - A chunk of images is copied, channel by channel, into one stacked plane: rows of pitch
//   wp = w + 1 whose last element is zero, a zero row above every image and below the last
//   (struct Layout). The zero column serves as both the right and the left padding (the row
//   after), the zero rows as the top and bottom padding of two neighbours. Output pixel q of
//   that pitch reads tap (ky, kx) at q + (ky-1)*wp + kx-1: every tap of every output is one
//   contiguous, unaligned vector load, with no edge cases. The zero columns and rows are
//   computed too and thrown away: h*w / ((h+1)*(w+1)) of the work is useful, 94% at 28x28,
//   77% at 7x7, 64% at 4x4 (Note [Dense 4x4 planes] recovers those with AVX-512; narrower
//   planes stay on im2col + GEMM).
// - Forward: a register tile of CB output channels x NV vectors of pixels accumulates over the
//   input channels and the 9 taps (per tap NV loads, CB broadcast weights, CB*NV FMAs; weights
//   packed [channel block][in channel][tap][CB]); the tile is written to a scratch row and
//   moved to NCHW with the bias and the fused ReLU.
// - Input gradient: the same kernel on the stacked dY (masked by the fused ReLU's output) with
//   the weights transposed and flipped: dX[ci] = sum_co W[co, ci, 2-ky, 2-kx] dY[co] shifted.
// - Weight gradient: dW[co, ci, tap] = sum over output pixels of dY[co, pixel] X[ci, the pixel's
//   stacked position + tap's offset], vectors across the output channels (Note [Transposed
//   weight gradient]).
// Vectors are GCC vector extensions; the kernels are compiled three times (AVX-512: 16 floats,
// 8x3 forward tile, 2 vectors of output channels x 9 taps for dW; AVX2 + FMA: 8 floats, 4x3,
// 1x9; SSE2: 4 floats, 4x2, 1x9) and picked by the CPU at the first call (direct_conv_isa). This file is built with
// -ffp-contract=fast, so the vector a*b+c are FMAs: the sums are not im2col + GEMM's sums and
// differ between the three builds (as OpenBLAS's differ between its core types), but a run on
// one machine is bitwise repeatable: the chunks are a function of the layer and the batch only,
// and the weight and bias gradients do not depend on them (image by image in the batch's order).
//
// Note [Transposed weight gradient]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The weight gradient used to run as the forward does, vectors along the stacked pixels: per
// vector of pixels CBW dY loads and 9 X loads at the taps' offsets for 9*CBW FMAs, the X loads
// unaligned (each across two cache lines on a 64-byte vector), the zero columns and rows
// computed too, and a fold of every accumulator to 4 lanes per chunk. Measured per call (batch
// 64, AVX-512 on Zen 5) it ran at 0.72-0.80 of the forward's FLOP rate on every shape: bound by
// the loads, not the FMAs. Now the vectors run across the output channels instead: dY is
// transposed per chunk to dyt [pixel][cout_r] (output pixels only, 4 x 4 blocks in registers,
// the ReLU mask applied, channels zero-padded to whole vectors of 16), and per output pixel a tile
// of CBV vectors of channels x CI input channels x 9 taps takes CBV loads of dyt and one
// broadcast of each X value from the stacked planes (an FMA's memory operand): no unaligned
// vector loads, no padding computed, no sum across lanes. The taps' addresses are a few row
// pointers with constant displacements (ox - 1, ox, ox + 1 at stride 1; each phase's pointer at
// stride 2), or GCC spills its per-tap pointers. Each image's sums (its own register tile)
// are added to lanes [ci][tap][cout_r] in the batch's order, so the bits do not depend on the
// chunking (tested); lanes are moved to dw [co][ci][tap] at the end. The bias gradient is
// summed the same way from dyt. Tiles: AVX-512 2 vectors x 1 channel (18 accumulators), 1 vector
// x 2 channels where out_c is one vector (layer1: 3 vectors and 1 x 3 channels measured slower);
// AVX2 and SSE2 1 x 1.
// Measured (2026-11-27, AVX-512, best of 15 calls of batch 64 on the loaded shared machine; dW
// only, the forward's FLOP rate in brackets), ms before -> after:
//   stem 3->16 28x28 0.31 -> 0.30 (143 GF/s);  layer1 16 28x28 1.64 -> 1.15-1.47 (197 GF/s)
//   layer2.0 16->32 /2 1.01 -> 0.72-0.76 (151);  layer2 32 14x14 1.54 -> 1.00-1.13 (193)
//   layer3.0 32->64 /2 0.98 -> 0.68-0.73 (137);  layer3 64 7x7 1.56 -> 1.03-1.10 (174)
//   layer4.0 64->128 /2 1.72 -> 0.97-1.02 (123); layer4 128 4x4 2.11 -> 1.53-1.65 (223)
//
// Note [Strided direct convolution]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// ResNet's first convolution of layers 2-4 is 3x3 with stride 2. Its input is split into four
// phases, P_ab[i, j] = x[2i + a, 2j + b], each stacked at the output's size (zero past the
// input's edge). Output (oy, ox) reads x[2oy + ky - 1, 2ox + kx - 1]: for ky = 1 that is phase
// a = 0 at row oy, for ky = 0 phase a = 1 at row oy - 1 (the zero row above the first), for
// ky = 2 phase 1 at row oy; the same for columns. So each tap is one phase at a shift of 0 or
// -1 (Layout::at), and forward and the weight gradient are the stride-1 kernels over 4*in_c
// planes. The input gradient of phase ab gathers only that phase's taps (1, 2, 2 or 4 of them),
// reading dY at minus their shift (0 or +1: the zero column and the zero row below), and is
// scattered back to x's pixels of that phase.
//
// Measured (issue 24: CPU seconds of 20 training steps of ResNet-18 width 16 batch 64, GEMMs on
// OPENBLAS_CORETYPE=Haswell, interleaved with main's build on the shared machine, startup 0.33
// s included): im2col + GEMM 3.3 s; these kernels on the 28x28 and 14x14 stride-1 layers 2.5 s,
// on every stride-1 layer 2.2 s, with stride 2 and dense 4x4 planes 2.1 s.
#include "model/cpu_direct_conv.h"

#include <algorithm>
#include <cstring>
#include <string_view>
#include <vector>

#include "model/cpu_conv.h"
#include "model/cpu_vec.h"

namespace dtrain::cpu {

namespace {

constexpr int64_t kTaps = 9;
constexpr int64_t kTile = 48;       // pixels a row of every build's forward tile divides
constexpr int64_t kChannelPad = 8;  // output channels padded to every build's CB
constexpr int64_t kFront = 16;      // zeros before a stacked plane's first row (tap offsets reach -wp-1)
constexpr int64_t kChunkBytes = int64_t{512} << 10;
constexpr int64_t kGradChannelPad = 16;  // the weight gradient's output channels: whole vectors of every build

int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

// A chunk of nb images' planes of one channel, stacked (Note [Direct CPU convolution]): rows of
// pitch wp = w + 1 (the last column zero), a zero row above each image and one below the last;
// kFront zeros ahead, zero slack behind; h x w is the output's size. Output pixel q (q = (n*(h+1)
// + oy)*wp + ox, from the first image's first row) lies at base + q. With stride 1 the input is
// one such plane per channel and tap t reads base + q + at[t]; with stride 2 it is four, its
// phases (x[2i + a, 2j + b] at (i, j): phase 2a + b, Note [Strided direct convolution]), and
// at[t] also selects tap t's phase.
//
// Dense (Note [Dense 4x4 planes]): 4x4 planes at stride 1 with 16-float vectors, the images'
// planes one after another without zero rows or columns (wp = 4), each vector one image; tap
// t's loads are masked by masks[t] instead.
struct Layout {
  bool dense;
  int64_t h, w, in_h, in_w, stride, phases, wp, nb, q, qr, base, sp, in_stride;
  int64_t at[kTaps];
  Layout(const kernels::ConvGeometry& g, int64_t images, bool dense_4x4 = false)
      : dense(dense_4x4 && g.stride == 1 && g.oh == 4 && g.ow == 4), h(g.oh), w(g.ow), in_h(g.h), in_w(g.w),
        stride(g.stride), phases(g.stride * g.stride), nb(images) {
    wp = dense ? w : w + 1;
    q = dense ? nb * h * w : (nb * (h + 1) - 1) * wp;  // the outputs' rows, any zero rows between images included
    qr = round_up(q, kTile);                           // ... rounded up to whole tiles
    base = dense ? kFront : kFront + wp;
    sp = round_up(base + qr + wp + 2, 16);
    in_stride = phases * sp;
    for (int64_t t = 0; t < kTaps; ++t) {
      const int64_t ky = t / 3, kx = t % 3;
      at[t] = stride == 1 ? (ky - 1) * wp + kx - 1 : phase(ky, kx) * sp + row_shift(ky) * wp + row_shift(kx);
    }
  }
  // Stride 2: tap (ky, kx) reads phase (ky != 1, kx != 1) at (oy + row_shift(ky), ox + row_shift(kx)).
  static int64_t phase(int64_t ky, int64_t kx) { return (ky == 1 ? 0 : 2) + (kx == 1 ? 0 : 1); }
  static int64_t row_shift(int64_t k) { return k == 0 ? -1 : 0; }
};

int64_t chunk_images(const DirectConv& d) {
  const int64_t per_image = (d.g.c * d.g.stride * d.g.stride + d.out_c) * (d.g.oh + 1) * (d.g.ow + 1) *
                            static_cast<int64_t>(sizeof(float));
  return std::clamp<int64_t>(kChunkBytes / per_image, 1, std::max<int64_t>(1, d.batch));
}

struct Scratch {
  float *xpad, *dypad, *wpack, *out, *dyt, *lanes;
};
// The scratch for chunks of up to chunk_images(d) images: the offsets of its parts and its size.
struct ScratchPlan {
  int64_t dypad, wpack, out, dyt, lanes, total;
  explicit ScratchPlan(const DirectConv& d) {
    const Layout l(d.g, chunk_images(d));
    const int64_t cin = d.g.c, cout = d.out_c;
    dypad = cin * l.in_stride;  // xpad first
    wpack = dypad + cout * l.sp;
    out = wpack + std::max(round_up(cout, kChannelPad) * cin, round_up(cin, kChannelPad) * cout) * kTaps;
    dyt = out + std::max(round_up(cout, kChannelPad), round_up(cin, kChannelPad)) * l.qr;
    lanes = dyt + l.nb * l.h * l.w * round_up(cout, kGradChannelPad);
    total = lanes + cin * kTaps * round_up(cout, kGradChannelPad);
  }
};
Scratch carve(const DirectConv& d, float* s) {
  const ScratchPlan p(d);
  return {s, s + p.dypad, s + p.wpack, s + p.out, s + p.dyt, s + p.lanes};
}

// dst [channels][l.sp]: the stacked planes of src's l.nb images [nb, channels, h, w]; with mask
// (same layout as src), each element zeroed where mask <= 0 (the fused ReLU's gradient).
void stack_planes(const float* __restrict src, const float* __restrict mask, int64_t channels, const Layout& l,
                  float* __restrict dst) {
  if (l.dense) {  // the planes one after another
    const int64_t plane = l.h * l.w;
    for (int64_t c = 0; c < channels; ++c) {
      float* o = dst + c * l.sp;
      std::memset(o, 0, sizeof(float) * static_cast<size_t>(l.base));
      for (int64_t n = 0; n < l.nb; ++n) {
        const float* sp = src + (n * channels + c) * plane;
        float* op = o + l.base + n * plane;
        if (mask) {
          const float* mp = mask + (n * channels + c) * plane;
          for (int64_t p = 0; p < plane; ++p) op[p] = mp[p] > 0.f ? sp[p] : 0.f;
        } else {
          for (int64_t p = 0; p < plane; ++p) op[p] = sp[p];
        }
      }
      const int64_t tail = l.base + l.nb * plane;
      std::memset(o + tail, 0, sizeof(float) * static_cast<size_t>(l.sp - tail));
    }
    return;
  }
  for (int64_t c = 0; c < channels; ++c) {
    float* o = dst + c * l.sp;
    std::memset(o, 0, sizeof(float) * static_cast<size_t>(l.base));  // the front and the first zero row
    for (int64_t n = 0; n < l.nb; ++n) {
      const float* s = src + (n * channels + c) * l.h * l.w;
      const float* m = mask ? mask + (n * channels + c) * l.h * l.w : nullptr;
      float* rows = o + l.base + n * (l.h + 1) * l.wp;
      for (int64_t y = 0; y < l.h; ++y) {
        float* row = rows + y * l.wp;
        const float* sr = s + y * l.w;
        if (m) {
          const float* mr = m + y * l.w;
          for (int64_t x = 0; x < l.w; ++x) row[x] = mr[x] > 0.f ? sr[x] : 0.f;
        } else {
          for (int64_t x = 0; x < l.w; ++x) row[x] = sr[x];  // rows of 4-28: a loop, not a memcpy call
        }
        row[l.w] = 0.f;
      }
      std::memset(rows + l.h * l.wp, 0, sizeof(float) * static_cast<size_t>(l.wp));  // the zero row below
    }
    const int64_t tail = l.base + (l.nb * (l.h + 1)) * l.wp;
    std::memset(o + tail, 0, sizeof(float) * static_cast<size_t>(l.sp - tail));
  }
}

// The stride-2 input: dst [channels][4][l.sp], phase 2a + b of channel c holding x[n, c, 2i + a,
// 2j + b] at (i, j) (zero past the input's last row or column).
void stack_phases(const float* __restrict src, int64_t channels, const Layout& l, float* __restrict dst) {
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t p = 0; p < 4; ++p) {
      const int64_t a = p / 2, b = p % 2;
      float* o = dst + (c * 4 + p) * l.sp;
      std::memset(o, 0, sizeof(float) * static_cast<size_t>(l.base));
      for (int64_t n = 0; n < l.nb; ++n) {
        const float* s = src + (n * channels + c) * l.in_h * l.in_w;
        float* rows = o + l.base + n * (l.h + 1) * l.wp;
        for (int64_t i = 0; i < l.h; ++i) {
          float* row = rows + i * l.wp;
          const int64_t y = 2 * i + a;
          if (y < l.in_h) {
            const float* sr = s + y * l.in_w + b;
            const int64_t inside = std::min(l.w, (l.in_w - b + 1) / 2);
            for (int64_t j = 0; j < inside; ++j) row[j] = sr[2 * j];
            for (int64_t j = inside; j < l.w; ++j) row[j] = 0.f;
          } else {
            std::fill(row, row + l.w, 0.f);
          }
          row[l.w] = 0.f;
        }
        std::fill(rows + l.h * l.wp, rows + (l.h + 1) * l.wp, 0.f);
      }
      const int64_t tail = l.base + (l.nb * (l.h + 1)) * l.wp;
      std::memset(o + tail, 0, sizeof(float) * static_cast<size_t>(l.sp - tail));
    }
}

// dx[n, c, 2i + a, 2j + b] = t[c, q] for (i, j) inside the input: the stride-2 input gradient's
// phase 2a + b, t's rows of length l.qr indexed by the stacked layout's q.
void unstack_phase(const float* __restrict t, int64_t channels, int64_t a, int64_t b, const Layout& l,
                   float* __restrict dx) {
  const int64_t rows = std::min(l.h, (l.in_h - a + 1) / 2), cols = std::min(l.w, (l.in_w - b + 1) / 2);
  for (int64_t n = 0; n < l.nb; ++n)
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t i = 0; i < rows; ++i) {
        const float* src = t + c * l.qr + (n * (l.h + 1) + i) * l.wp;
        float* dst = dx + ((n * channels + c) * l.in_h + 2 * i + a) * l.in_w + b;
        for (int64_t j = 0; j < cols; ++j) dst[2 * j] = src[j];
      }
}

// y[n, c, oy, ox] = t[c, q] (+ bias[c], then max(., 0) when relu) for the chunk's images
// and `channels` channels, t's rows of length l.qr indexed by the stacked layout's q.
void unstack_planes(const float* __restrict t, const float* bias, bool relu, int64_t channels, const Layout& l,
                    float* __restrict y) {
  for (int64_t n = 0; n < l.nb; ++n)
    for (int64_t c = 0; c < channels; ++c) {
      const float b = bias ? bias[c] : 0.f;
      for (int64_t oy = 0; oy < l.h; ++oy) {
        const float* src = t + c * l.qr + (n * (l.dense ? l.h : l.h + 1) + oy) * l.wp;
        float* dst = y + ((n * channels + c) * l.h + oy) * l.w;
        if (relu) {
          for (int64_t ox = 0; ox < l.w; ++ox) {
            const float v = src[ox] + b;
            dst[ox] = v > 0.f ? v : 0.f;
          }
        } else if (bias) {
          for (int64_t ox = 0; ox < l.w; ++ox) dst[ox] = src[ox] + b;
        } else {
          for (int64_t ox = 0; ox < l.w; ++ox) dst[ox] = src[ox];
        }
      }
    }
}

// wpk[block][i][t][CB] for the nt taps taps[t]: w[block*CB + j, i, taps[t]] (forward), or for the
// input gradient (transposed: the planes convolved are dY's, the outputs dX's) w[i, block*CB +
// j, taps[t]]; channels past the last are zero.
void pack_weights(const float* w, int64_t out_c, int64_t in_c, bool transposed, const int64_t* taps, int64_t nt,
                  int64_t cb, float* wpk) {
  const int64_t outs = transposed ? in_c : out_c, ins = transposed ? out_c : in_c;
  for (int64_t o0 = 0; o0 < round_up(outs, cb); o0 += cb)
    for (int64_t i = 0; i < ins; ++i)
      for (int64_t t = 0; t < nt; ++t)
        for (int64_t j = 0; j < cb; ++j) {
          const int64_t o = o0 + j;
          float v = 0.f;
          if (o < outs) v = transposed ? w[(i * in_c + o) * kTaps + taps[t]] : w[(o * in_c + i) * kTaps + taps[t]];
          wpk[(o0 * ins + i * cb) * nt + t * cb + j] = v;
        }
}

// The taps of the input gradient, as convolutions of dY: with stride 1 the 9 taps flipped (dX
// reads dY at -at[t], i.e. at at[8 - t]); with stride 2 phase p's own taps, dY read at minus
// their shift (Note [Strided direct convolution]).
struct InputGradTaps {
  int64_t nt;
  int64_t tap[kTaps], at[kTaps];
};
InputGradTaps input_grad_taps(const Layout& l, int64_t p) {
  InputGradTaps r{};
  for (int64_t t = 0; t < kTaps; ++t) {
    const int64_t ky = t / 3, kx = t % 3;
    if (l.stride == 1) {
      r.tap[r.nt] = kTaps - 1 - t;
      r.at[r.nt++] = l.at[t];
    } else if (Layout::phase(ky, kx) == p) {
      r.tap[r.nt] = t;
      r.at[r.nt++] = -(Layout::row_shift(ky) * l.wp + Layout::row_shift(kx));
    }
  }
  return r;
}

using vec::Bits;
using vec::load;
using vec::store;
using vec::Vec;

// Note [Dense 4x4 planes]
// ~~~~~~~~~~~~~~~~~~~~~~~
// ResNet's layer4 convolves 4x4 planes: stacked with a zero row and column (struct Layout) only
// 16 of every 25 pixels computed are outputs. With 16-float vectors (the AVX-512 build) a
// 4x4 plane is exactly one vector, so the planes lie one after another and every vector is one
// image; a tap's load reaches into the neighbouring rows and images where the padding should
// be, and is masked instead: lane p of masks[t] keeps tap t's pixel when (p/4 + ky - 1,
// p%4 + kx - 1) lies inside the plane. One AND per load, no wasted lanes.
struct DenseMasks {
  Bits<16> m[kTaps];
  DenseMasks() {
    for (int64_t t = 0; t < kTaps; ++t)
      for (int p = 0; p < 16; ++p) {
        const int64_t y = p / 4 + t / 3 - 1, x = p % 4 + t % 3 - 1;
        m[t][p] = y >= 0 && y < 4 && x >= 0 && x < 4 ? -1 : 0;
      }
  }
};

// v, or v masked by masks[t] (dense planes only; masks nullptr otherwise).
template <int V, bool DENSE>
[[gnu::always_inline]] inline void mask_tap(Vec<V>& v, const DenseMasks* masks, int t) {
  if constexpr (DENSE && V == 16) v = reinterpret_cast<Vec<V>>(reinterpret_cast<Bits<V>>(v) & masks->m[t]);
}

// out[o, q] for o < outs (rounded up to CB), q < qr: sum over the `ins` stacked inputs `in`
// (in_stride apart) and the NT taps of wpk's weights times in[i, base + q + at[tap]].
template <int V, int CB, int NV, int NT, bool DENSE = false>
[[gnu::always_inline]] inline void conv_planes(const float* __restrict in, int64_t ins, int64_t in_stride,
                                               const int64_t* at, const Layout& l, const float* __restrict wpk,
                                               int64_t outs, float* __restrict out,
                                               const DenseMasks* masks = nullptr) {
  for (int64_t o0 = 0; o0 < outs; o0 += CB) {
    const float* wb = wpk + o0 * ins * NT;
    for (int64_t q0 = 0; q0 < l.qr; q0 += V * NV) {
      Vec<V> acc[CB][NV] = {};
      for (int64_t i = 0; i < ins; ++i) {
        const float* ip = in + i * in_stride + l.base + q0;
        const float* wi = wb + i * NT * CB;
#pragma GCC unroll 9
        for (int t = 0; t < NT; ++t) {
          Vec<V> xv[NV];
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) {
            load<V>(xv[v], ip + at[t] + v * V);
            mask_tap<V, DENSE>(xv[v], masks, t);
          }
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

// dyt [l.nb * h * w][cout_r] (pixel-major, channels padded with zeros to cout_r): the chunk's
// output gradient [nb, cout, h, w] transposed, zeroed where mask <= 0 (the fused ReLU's gradient).
inline void transpose_dy(const float* __restrict dy, const float* __restrict mask, int64_t cout, int64_t cout_r,
                         const Layout& l, float* __restrict dyt) {
  using V4 = Vec<4>;
  using M4 = Bits<4>;
  const int64_t plane = l.h * l.w;
  auto at = [&](const float* s, int64_t i) { return !mask || mask[s - dy + i] > 0.f ? s[i] : 0.f; };
  for (int64_t n = 0; n < l.nb; ++n) {
    const float* src = dy + n * cout * plane;
    float* dst = dyt + n * plane * cout_r;
    int64_t p0 = 0;
    for (; p0 + 4 <= plane; p0 += 4) {  // 4 x 4 blocks transposed in registers
      int64_t c0 = 0;
      for (; c0 + 4 <= cout; c0 += 4) {
        V4 a[4];
        for (int i = 0; i < 4; ++i) {
          const int64_t off = (c0 + i) * plane + p0;
          load<4>(a[i], src + off);
          if (mask) {
            V4 m;
            load<4>(m, mask + n * cout * plane + off);
            a[i] = reinterpret_cast<V4>(reinterpret_cast<M4>(a[i]) & (m > 0.f));
          }
        }
        const V4 t0 = __builtin_shuffle(a[0], a[1], M4{0, 4, 1, 5}), t1 = __builtin_shuffle(a[0], a[1], M4{2, 6, 3, 7});
        const V4 t2 = __builtin_shuffle(a[2], a[3], M4{0, 4, 1, 5}), t3 = __builtin_shuffle(a[2], a[3], M4{2, 6, 3, 7});
        store<4>(dst + (p0 + 0) * cout_r + c0, __builtin_shuffle(t0, t2, M4{0, 1, 4, 5}));
        store<4>(dst + (p0 + 1) * cout_r + c0, __builtin_shuffle(t0, t2, M4{2, 3, 6, 7}));
        store<4>(dst + (p0 + 2) * cout_r + c0, __builtin_shuffle(t1, t3, M4{0, 1, 4, 5}));
        store<4>(dst + (p0 + 3) * cout_r + c0, __builtin_shuffle(t1, t3, M4{2, 3, 6, 7}));
      }
      for (int64_t p = p0; p < p0 + 4; ++p)
        for (int64_t c = c0; c < cout_r; ++c) dst[p * cout_r + c] = c < cout ? at(src, c * plane + p) : 0.f;
    }
    for (int64_t p = p0; p < plane; ++p)
      for (int64_t c = 0; c < cout_r; ++c) dst[p * cout_r + c] = c < cout ? at(src, c * plane + p) : 0.f;
  }
}

// lanes[ci0 + c, tap, co0 + v*V + lane] (+)= the sum over image n's pixels (n, oy, ox) of
// dyt[pixel, co] X[ci, base + q + at[tap]], q = (n*(h+1) + oy)*wp + ox its stacked position, for
// c < CI and v < CBV (Note [Transposed weight gradient]): vectors across output channels, each
// X value one broadcast, no sum across lanes; overwrite: =, the batch's first image.
template <int V, int CBV, int CI, bool STRIDE1>
[[gnu::always_inline]] inline void weight_grad_tile(const float* __restrict xpad, const float* __restrict dyt,
                                                    int64_t cout_r, int64_t co0, int64_t ci0, int64_t n,
                                                    const Layout& l, bool overwrite, float* __restrict lanes) {
  Vec<V> acc[CBV][CI * kTaps] = {};
  // Tap (ky, kx) reads row pointer r[ky][kx != 1] at ox + kx - 1 (stride 1, one row pointer per
  // ky) or ox - (kx == 0) (stride 2: kx = 1 its own phase): constant displacements off a few
  // pointers (with one pointer per tap GCC ran out of registers and reloaded them).
  int64_t row[3][2];
  for (int ky = 0; ky < 3; ++ky) {
    row[ky][0] = l.at[ky * 3 + 1];
    row[ky][1] = l.stride == 1 ? l.at[ky * 3 + 1] : l.at[ky * 3 + 2];
  }
  for (int64_t oy = 0; oy < l.h; ++oy) {
    const float* xr = xpad + ci0 * l.in_stride + l.base + (n * (l.h + 1) + oy) * l.wp;
    const float* dr = dyt + (n * l.h + oy) * l.w * cout_r + co0;
    const float* r[CI][3][2];
#pragma GCC unroll 4
    for (int c = 0; c < CI; ++c)
      for (int ky = 0; ky < 3; ++ky)
        for (int k = 0; k < 2; ++k) r[c][ky][k] = xr + c * l.in_stride + row[ky][k];
    for (int64_t ox = 0; ox < l.w; ++ox, dr += cout_r) {
      Vec<V> g[CBV];
#pragma GCC unroll 4
      for (int v = 0; v < CBV; ++v) load<V>(g[v], dr + v * V);
#pragma GCC unroll 4
      for (int c = 0; c < CI; ++c)
#pragma GCC unroll 3
        for (int ky = 0; ky < 3; ++ky)
#pragma GCC unroll 3
          for (int kx = 0; kx < 3; ++kx) {
            const float xs = kx == 1 ? r[c][ky][0][ox] : r[c][ky][1][ox + (kx == 0 ? -1 : STRIDE1 ? 1 : 0)];
#pragma GCC unroll 4
            for (int v = 0; v < CBV; ++v) acc[v][c * kTaps + ky * 3 + kx] += g[v] * xs;
          }
    }
  }
#pragma GCC unroll 4
  for (int c = 0; c < CI; ++c)
#pragma GCC unroll 9
    for (int t = 0; t < kTaps; ++t)
#pragma GCC unroll 4
      for (int v = 0; v < CBV; ++v) {
        float* o = lanes + ((ci0 + c) * kTaps + t) * cout_r + co0 + v * V;
        Vec<V> sum = acc[v][c * kTaps + t];
        if (!overwrite) {
          Vec<V> before;
          load<V>(before, o);
          sum = before + sum;
        }
        store<V>(o, sum);
      }
}

// db[co] (+)= the sum of dyt's rows, image by image in the batch's order (overwrite: the batch's
// first image with beta 0).
template <int V>
[[gnu::always_inline]] inline void bias_grad(const float* __restrict dyt, int64_t cout, int64_t cout_r,
                                             const Layout& l, int64_t n0, bool beta_zero, float* __restrict db) {
  const int64_t plane = l.h * l.w;
  for (int64_t n = 0; n < l.nb; ++n)
    for (int64_t c0 = 0; c0 < cout; c0 += V) {
      Vec<V> sum = {};
      const float* p = dyt + n * plane * cout_r + c0;
      for (int64_t i = 0; i < plane; ++i, p += cout_r) {
        Vec<V> v;
        load<V>(v, p);
        sum += v;
      }
      const bool overwrite = beta_zero && n0 + n == 0;  // not beta * db: stale memory may hold NaN
      for (int64_t j = 0; j < V && c0 + j < cout; ++j) db[c0 + j] = overwrite ? sum[j] : db[c0 + j] + sum[j];
    }
}

// dw[co, ci, tap] = lanes[ci, tap, co] (+ dw unless overwrite: beta 0).
inline void untranspose_dw(const float* lanes, int64_t cout, int64_t cout_r, int64_t cin, bool overwrite,
                           float* dw) {
  const int64_t ks = cin * kTaps;
  for (int64_t k0 = 0; k0 < ks; k0 += 16)  // 16 rows of lanes at a time: their lines stay in L1 across co
    for (int64_t co = 0; co < cout; ++co)
      for (int64_t k = k0; k < std::min(k0 + 16, ks); ++k) {
        const float s = lanes[k * cout_r + co];
        float& o = dw[co * ks + k];
        o = overwrite ? s : o + s;  // not beta * dw: stale memory may hold NaN
      }
}

// The stride's input in xpad: stacked planes, or their phases.
inline void stack_input(const float* x, int64_t cin, const Layout& l, float* xpad) {
  if (l.stride == 1)
    stack_planes(x, nullptr, cin, l, xpad);
  else
    stack_phases(x, cin, l, xpad);
}

template <int V, int CB, int NV>
[[gnu::always_inline]] inline void forward_impl(const DirectConv& d, const float* x, const float* w, const float* bias,
                                                bool relu, float* y, float* scratch) {
  const Scratch s = carve(d, scratch);
  const int64_t cin = d.g.c, cout = d.out_c, in_size = cin * d.g.h * d.g.w, out_size = cout * d.g.oh * d.g.ow;
  const int64_t chunk = chunk_images(d);
  const int64_t taps[kTaps] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  pack_weights(w, cout, cin, false, taps, kTaps, CB, s.wpack);
  static const DenseMasks masks;
  for (int64_t n0 = 0; n0 < d.batch; n0 += chunk) {
    const Layout l(d.g, std::min(chunk, d.batch - n0), V == 16);
    stack_input(x + n0 * in_size, cin, l, s.xpad);
    if (l.dense)
      conv_planes<V, CB, NV, kTaps, true>(s.xpad, cin, l.in_stride, l.at, l, s.wpack, cout, s.out, &masks);
    else
      conv_planes<V, CB, NV, kTaps>(s.xpad, cin, l.in_stride, l.at, l, s.wpack, cout, s.out);
    unstack_planes(s.out, bias, relu, cout, l, y + n0 * out_size);
  }
}

// The chunk's weight gradient into s.lanes, image by image (each image's sums added in the
// batch's order, whatever the chunking): CBV vectors of output channels by CI input channels at
// a time, then single vectors by CI1 channels.
template <int V, int CBV, int CI, int CI1, bool STRIDE1>
[[gnu::always_inline]] inline void weight_grad(const Scratch& s, int64_t cin, int64_t cout_r, const Layout& l,
                                               int64_t n0) {
  for (int64_t n = 0; n < l.nb; ++n) {
    const bool first = n0 + n == 0;
    int64_t co0 = 0;
    for (; co0 + CBV * V <= cout_r; co0 += CBV * V) {
      int64_t ci = 0;
      for (; ci + CI <= cin; ci += CI) weight_grad_tile<V, CBV, CI, STRIDE1>(s.xpad, s.dyt, cout_r, co0, ci, n, l, first, s.lanes);
      for (; ci < cin; ++ci) weight_grad_tile<V, CBV, 1, STRIDE1>(s.xpad, s.dyt, cout_r, co0, ci, n, l, first, s.lanes);
    }
    for (; co0 < cout_r; co0 += V) {
      int64_t ci = 0;
      for (; ci + CI1 <= cin; ci += CI1) weight_grad_tile<V, 1, CI1, STRIDE1>(s.xpad, s.dyt, cout_r, co0, ci, n, l, first, s.lanes);
      for (; ci < cin; ++ci) weight_grad_tile<V, 1, 1, STRIDE1>(s.xpad, s.dyt, cout_r, co0, ci, n, l, first, s.lanes);
    }
  }
}

// dX of a chunk (l): per phase (one with stride 1), the convolution of dY with that phase's
// taps (packed in wpk one phase after another), then moved to NCHW.
template <int V, int CB, int NV>
[[gnu::always_inline]] inline void input_grad(const Scratch& s, int64_t cin, int64_t cout, const Layout& l,
                                              float* dx) {
  const float* wpk = s.wpack;
  for (int64_t p = 0; p < l.phases; ++p) {
    const InputGradTaps tg = input_grad_taps(l, p);
    static const DenseMasks masks;  // stride 1's taps are listed in at's order: mask t is tap t's
    switch (l.dense ? 0 : tg.nt) {  // stride 1: 9; stride 2: 1, 2, 2, 4
      case 0: conv_planes<V, CB, NV, 9, true>(s.dypad, cout, l.sp, tg.at, l, wpk, cin, s.out, &masks); break;
      case 9: conv_planes<V, CB, NV, 9>(s.dypad, cout, l.sp, tg.at, l, wpk, cin, s.out); break;
      case 4: conv_planes<V, CB, NV, 4>(s.dypad, cout, l.sp, tg.at, l, wpk, cin, s.out); break;
      case 2: conv_planes<V, CB, NV, 2>(s.dypad, cout, l.sp, tg.at, l, wpk, cin, s.out); break;
      default: conv_planes<V, CB, NV, 1>(s.dypad, cout, l.sp, tg.at, l, wpk, cin, s.out); break;
    }
    wpk += round_up(cin, CB) * cout * tg.nt;
    if (l.stride == 1)
      unstack_planes(s.out, nullptr, false, cin, l, dx);
    else
      unstack_phase(s.out, cin, p / 2, p % 2, l, dx);
  }
}

template <int V, int CB, int NV, int CBV, int CI, int CI1>
[[gnu::always_inline]] inline void backward_impl(const DirectConv& d, const float* x, const float* w, const float* dy,
                                                 const float* relu_output, float* dx, float* dw, float dw_beta,
                                                 float* db, float db_beta, float* scratch) {
  const Scratch s = carve(d, scratch);
  const int64_t cin = d.g.c, cout = d.out_c, in_size = cin * d.g.h * d.g.w, out_size = cout * d.g.oh * d.g.ow;
  const int64_t chunk = chunk_images(d);
  if (dx) {  // every phase's taps, one after another (their weights do not depend on the chunk)
    const Layout l(d.g, 1);
    float* wpk = s.wpack;
    for (int64_t p = 0; p < l.phases; ++p) {
      const InputGradTaps tg = input_grad_taps(l, p);
      pack_weights(w, cout, cin, true, tg.tap, tg.nt, CB, wpk);
      wpk += round_up(cin, CB) * cout * tg.nt;
    }
  }
  // A batch of 0 still writes the gradients (beta 0) as the GEMM path does.
  if (d.batch == 0) {
    if (dw_beta == 0.f) std::fill(dw, dw + cout * cin * kTaps, 0.f);
    if (db && db_beta == 0.f) std::fill(db, db + cout, 0.f);
  }
  const int64_t cout_r = round_up(cout, kGradChannelPad);
  for (int64_t n0 = 0; n0 < d.batch; n0 += chunk) {
    const int64_t nb = std::min(chunk, d.batch - n0);
    const Layout lx(d.g, nb);  // dW reads x padded (never dense): Note [Transposed weight gradient]
    const float* mask = relu_output ? relu_output + n0 * out_size : nullptr;
    stack_input(x + n0 * in_size, cin, lx, s.xpad);
    transpose_dy(dy + n0 * out_size, mask, cout, cout_r, lx, s.dyt);
    if (db) bias_grad<V>(s.dyt, cout, cout_r, lx, n0, db_beta == 0.f, db);
    if (lx.stride == 1)
      weight_grad<V, CBV, CI, CI1, true>(s, cin, cout_r, lx, n0);
    else
      weight_grad<V, CBV, CI, CI1, false>(s, cin, cout_r, lx, n0);
    if (dx) {
      const Layout l(d.g, nb, V == 16);
      stack_planes(dy + n0 * out_size, mask, cout, l, s.dypad);
      input_grad<V, CB, NV>(s, cin, cout, l, dx + n0 * in_size);
    }
  }
  if (d.batch > 0) untranspose_dw(s.lanes, cout, cout_r, cin, dw_beta == 0.f, dw);
}

using ForwardFn = void (*)(const DirectConv&, const float*, const float*, const float*, bool, float*, float*);
using BackwardFn = void (*)(const DirectConv&, const float*, const float*, const float*, const float*, float*, float*,
                            float, float*, float, float*);
struct Impl {
  ForwardFn forward;
  BackwardFn backward;
  const char* name;
};

#define DTRAIN_DIRECT_CONV_IMPL(NAME, TARGET, V, CB, NV, CBV, CI, CI1)                                                  \
  TARGET void forward_##NAME(const DirectConv& d, const float* x, const float* w, const float* bias, bool relu,  \
                             float* y, float* scratch) {                                                         \
    forward_impl<V, CB, NV>(d, x, w, bias, relu, y, scratch);                                                    \
  }                                                                                                              \
  TARGET void backward_##NAME(const DirectConv& d, const float* x, const float* w, const float* dy,             \
                              const float* relu_output, float* dx, float* dw, float dw_beta, float* db,          \
                              float db_beta, float* scratch) {                                                   \
    backward_impl<V, CB, NV, CBV, CI, CI1>(d, x, w, dy, relu_output, dx, dw, dw_beta, db, db_beta, scratch);             \
  }

DTRAIN_DIRECT_CONV_IMPL(generic, , 4, 4, 2, 1, 1, 1)
#if defined(__x86_64__) && defined(__GNUC__)
DTRAIN_DIRECT_CONV_IMPL(avx2, __attribute__((target("avx2,fma"))), 8, 4, 3, 1, 1, 1)
DTRAIN_DIRECT_CONV_IMPL(avx512, __attribute__((target("avx512f,avx512vl,avx2,fma"))), 16, 8, 3, 2, 1, 2)
#endif
#undef DTRAIN_DIRECT_CONV_IMPL

// The builds this CPU runs, best first.
std::vector<Impl> supported() {
#if defined(__x86_64__) && defined(__GNUC__)
  return vec::runnable_builds<Impl>({forward_avx512, backward_avx512, "avx512"}, {forward_avx2, backward_avx2, "avx2"},
                                    {forward_generic, backward_generic, "generic"});
#else
  return {{forward_generic, backward_generic, "generic"}};
#endif
}

Impl& impl() {
  static Impl chosen = supported().front();
  return chosen;
}

}  // namespace

bool direct_conv_fits(const kernels::ConvGeometry& g) {
  const bool same = g.stride == 1 && g.oh == g.h && g.ow == g.w;
  const bool halved = g.stride == 2 && g.oh == (g.h + 1) / 2 && g.ow == (g.w + 1) / 2;
  return g.kh == 3 && g.kw == 3 && g.pad == 1 && (same || halved) && g.ow >= kDirectConvMinWidth;
}

int64_t direct_conv_scratch_floats(const DirectConv& d) {
  return ScratchPlan(d).total;
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

bool select_direct_conv_isa(std::string_view name) { return vec::select_build(supported(), name, impl()); }

}  // namespace dtrain::cpu
