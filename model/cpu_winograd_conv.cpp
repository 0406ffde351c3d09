// The Winograd convolution kernels of model/cpu_winograd_conv.h.
//
// Note [Winograd CPU convolution]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The direct kernels (Note [Direct CPU convolution]) run near the core's FMA peak, so what is
// left is fewer multiplications. F(m x m, 3 x 3) (Lavin & Gray 2015) computes an m x m tile of
// outputs from an a x a tile of inputs, a = m + 2, as Y = A^T [(G g G^T) (.) (B^T d B)] A: per
// tile and channel pair a^2 products instead of 9 m^2 (F(2x2): 16 for 36, F(4x4): 36 for 144).
// The element-wise products summed over the input channels are a^2 independent GEMMs,
// M[xi] [out_c, tiles] = U[xi] [out_c, in_c] V[xi] [in_c, tiles]. Per chunk of images:
// - Every input tile's a^2 elements are gathered (stack_tiles, by an index list built once per
//   chunk size): element (r, s) of all the chunk's tiles in one row [a^2][tiles], one vector
//   lane per tile, no lane wasted on padding (struct Plan). A tile past the image's edge (7x7
//   in tiles of 2 or 4) reads zeros.
// - Per block of V*NV tiles (the GEMM's register tile): the input transform B^T d B of every
//   channel into V [a^2][in_c][block], the a^2 GEMMs (register tile CB output channels x NV
//   vectors, the weights broadcast, as the direct forward) into M [a^2][out_c][block], the
//   output transform A^T M A into the m^2 outputs of each tile; at the chunk's end those go to
//   NCHW with the bias and the fused ReLU (unstack_tiles). The transforms are unrolled with
//   the matrices as constants, so zero terms vanish and +-1 are additions (apply).
// - U = G g G^T in float, V weights at a time (transform_weights), once per call.
// - The input gradient of a stride-1 3x3 convolution is the same convolution of dY' (masked by
//   the fused ReLU) with the weights transposed and flipped, W'[ci, co, ky, kx] = W[co, ci,
//   2 - ky, 2 - kx]: the same kernels. The weight gradient stays direct.
// Every output element is the same operations whatever its lane, block or chunk, so a result is
// bitwise repeatable and does not depend on the chunking (tested). As with the direct kernels,
// the three builds (AVX-512, AVX2, SSE2) need not agree to the bit.
//
// Error: the transforms add and subtract scaled terms before and after the products, so the
// rounding grows with their coefficients: measured against double sums (random values in
// [-1, 1], cpu_winograd_conv_test.cpp), |error| / sum |terms| at most 2.6e-7 for F(2x2) and
// 4.5e-6 for F(4x4), the direct kernels' own bound being 2e-6. The ResNet fidelity test against
// PyTorch (tests/torch/resnet_fidelity_test.py, width 16) passes with both in use.
//
// Measured (2026-11-27, AVX-512 build, best of 7 calls of batch 64 on the shared machine;
// direct dX = direct backward minus its dW-only call), forward / input gradient, direct ms ->
// Winograd ms:
//   layer1 16 ch 28x28: F(2x2) 1.2 -> 3.1-3.5 / 1.1-1.4 -> 2.8-3.6;  F(4x4) -> 2.1-2.3 / 2.2-2.9
//   layer2 32 ch 14x14: F(2x2) 1.2 -> 1.7 / 1.2 -> 1.7;              F(4x4) -> 1.35-1.4 / 1.3-1.36
//   layer3 64 ch 7x7:   F(2x2) 1.4 -> 1.26 / 1.4 -> 1.18;            F(4x4) -> 0.93-0.95 / 0.91
//   layer4 128 ch 4x4:  F(2x2) 1.36 -> 1.1 / 1.7 -> 1.1;             F(4x4) -> 1.7-2.0 / 1.8
// At 16-32 channels the gather, the transforms and the move back to NCHW (each O(elements),
// not O(elements x channels)) cost more than the GEMM saves; an earlier layout of m^2 phase
// planes with a slot row and column of padding per image (cheaper copies, wasted lanes) lost
// there too (layer1 0.75x, layer2 0.9-1.0x). Hence Note [Winograd tile rule].
#include "model/cpu_winograd_conv.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "model/cpu_vec.h"

namespace dtrain::cpu {

namespace {

constexpr int64_t kBlock = 48;      // tile slots every build's block (V * NV) divides
constexpr int64_t kChannelPad = 8;  // output channels padded to every build's CB
constexpr int64_t kChunkBytes = int64_t{512} << 10;
// A block's V and M keep their a^2 matrices a cache line more than their size apart: at 64
// channels the size is 12 KB, a multiple of 4 KB, and the transforms' a^2 loads and stores
// all fell into one L1 set (layer3's input transform ran 4x slower).
constexpr int64_t kSkew = 16;

int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

// The transforms' matrices (Lavin & Gray, points 0, +-1 for F(2x2); 0, +-1, +-2 for F(4x4)).
template <int M>
struct Tf;
template <>
struct Tf<2> {
  static constexpr float BT[4][4] = {{1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, 1, 0, -1}};
  static constexpr float G[4][3] = {{1, 0, 0}, {.5, .5, .5}, {.5, -.5, .5}, {0, 0, 1}};
  static constexpr float AT[2][4] = {{1, 1, 1, 0}, {0, 1, -1, -1}};
};
template <>
struct Tf<4> {
  static constexpr float BT[6][6] = {{4, 0, -5, 0, 1, 0},  {0, -4, -4, 1, 1, 0}, {0, 4, -4, -1, 1, 0},
                                     {0, -2, -1, 2, 1, 0}, {0, 2, -1, -2, 1, 0}, {0, 4, 0, -5, 0, 1}};
  static constexpr float G[6][3] = {{1.f / 4, 0, 0},
                                    {-1.f / 6, -1.f / 6, -1.f / 6},
                                    {-1.f / 6, 1.f / 6, -1.f / 6},
                                    {1.f / 24, 1.f / 12, 1.f / 6},
                                    {1.f / 24, -1.f / 12, 1.f / 6},
                                    {0, 0, 1}};
  static constexpr float AT[4][6] = {{1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -2, 0}, {0, 1, 1, 4, 4, 0}, {0, 1, -1, 8, -8, 1}};
};

// A chunk of nb images in tile slots (Note [Winograd CPU convolution]): tile (n, ty, tx) at
// slot q = (n * th + ty) * tw + tx, no slot wasted; qr slots rounded up to whole blocks.
struct Plan {
  int64_t h, w, th, tw, nb, qr;
  Plan(const kernels::ConvGeometry& g, int m, int64_t images)
      : h(g.h), w(g.w), th((g.h + m - 1) / m), tw((g.w + m - 1) / m), nb(images) {
    qr = round_up(nb * th * tw, kBlock);
  }
};

int64_t chunk_images(const kernels::ConvGeometry& g, int m, int64_t cin, int64_t cout, int64_t batch) {
  const Plan one(g, m, 1);
  const int64_t per_image =
      (cin * (m + 2) * (m + 2) + cout * m * m) * one.th * one.tw * static_cast<int64_t>(sizeof(float));
  // Rounded up (to at most twice the budget) to images whose tiles fill whole blocks: layer3's 9
  // images of 4 tiles left a quarter of their 48-lane block empty, 12 fill it.
  const int64_t fill = kBlock / std::gcd(one.th * one.tw, kBlock);
  int64_t chunk = std::max<int64_t>(1, kChunkBytes / per_image);
  if (fill <= 2 * chunk) chunk = round_up(chunk, fill);
  return std::clamp<int64_t>(chunk, 1, std::max<int64_t>(1, batch));
}

// Floats between two of U's a^2 matrices [cout_r][cin], rounded up to whole vectors of every
// build (the weight transform goes V matrix elements at a time).
int64_t weight_stride(int64_t cout, int64_t cin) { return round_up(round_up(cout, kChannelPad) * cin, 16); }

// The scratch of a convolution from cin to cout channels: the gathered input tiles, the outputs,
// a block's V and M, the transformed weights.
struct ScratchPlan {
  int64_t out, vb, mb, u, ut, total;
  ScratchPlan(const kernels::ConvGeometry& g, int m, int64_t cin, int64_t cout, int64_t batch) {
    const Plan l(g, m, chunk_images(g, m, cin, cout, batch));
    const int64_t a2 = (m + 2) * (m + 2), cout_r = round_up(cout, kChannelPad);
    out = cin * a2 * l.qr;
    vb = out + cout * m * m * l.qr;
    mb = vb + a2 * (cin * kBlock + kSkew);
    u = mb + a2 * (cout_r * kBlock + kSkew);
    ut = u + a2 * weight_stride(cout, cin);
    total = ut + 9 * weight_stride(cout, cin);
  }
};

// The gathers of stack_tiles and unstack_tiles for a chunk of l.nb images of `channels`
// channels: in_map [a^2][nb * th * tw], the offset in src of element (r, s) of every tile, x[n,
// 0, m ty + r - 1, m tx + s - 1], -1 outside the image (a zero); out_map [h * w], the slot of
// each output pixel in its output plane (i * m + j) * qr. Small planes make short loops (layer4's
// 4x4: two tiles a row): one index list per chunk keeps every loop as long as the chunk.
template <int M>
void build_maps(const Plan& l, int64_t channels, std::vector<int32_t>& in_map, std::vector<int32_t>& out_map) {
  constexpr int A = M + 2;
  const int64_t tiles = l.th * l.tw, slots = l.nb * tiles;
  in_map.resize(static_cast<size_t>(A * A * slots));
  for (int r = 0; r < A; ++r)
    for (int s = 0; s < A; ++s)
      for (int64_t n = 0; n < l.nb; ++n)
        for (int64_t ty = 0; ty < l.th; ++ty)
          for (int64_t tx = 0; tx < l.tw; ++tx) {
            const int64_t y = M * ty + r - 1, x = M * tx + s - 1;
            const bool inside = y >= 0 && y < l.h && x >= 0 && x < l.w;
            in_map[static_cast<size_t>((r * A + s) * slots + n * tiles + ty * l.tw + tx)] =
                inside ? static_cast<int32_t>((n * channels * l.h + y) * l.w + x) : -1;
          }
  out_map.resize(static_cast<size_t>(l.h * l.w));
  for (int64_t oy = 0; oy < l.h; ++oy)
    for (int64_t ox = 0; ox < l.w; ++ox)
      out_map[static_cast<size_t>(oy * l.w + ox)] =
          static_cast<int32_t>(((oy % M) * M + ox % M) * l.qr + (oy / M) * l.tw + ox / M);
}

// dst [channels][a^2][l.qr]: element (r, s) of every input tile of src's l.nb images [nb,
// channels, h, w] at the tile's slot (in_map); with mask (src's layout), zeroed where mask <= 0
// (the fused ReLU's gradient). Slots past the images are zero (finite, thrown away). Not inlined
// into the builds: with AVX-512 GCC vectorizes the index loops as gathers, which ran 2x slower
// than scalar loads on Zen 4 (so does unstack_tiles').
template <int M>
void stack_tiles(const float* __restrict src, const float* __restrict mask,
                                               int64_t channels, const Plan& l, const int32_t* __restrict in_map,
                                               float* __restrict dst) {
  constexpr int A = M + 2;
  const int64_t slots = l.nb * l.th * l.tw, plane = l.h * l.w;
  for (int64_t c = 0; c < channels; ++c) {
    const float* sc = src + c * plane;
    const float* mc = mask ? mask + c * plane : nullptr;
    for (int p = 0; p < A * A; ++p) {
      float* o = dst + (c * A * A + p) * l.qr;
      const int32_t* idx = in_map + p * slots;
      if (mc)
        for (int64_t k = 0; k < slots; ++k) {
          const int32_t i = idx[k];
          o[k] = i >= 0 && mc[i] > 0.f ? sc[i] : 0.f;
        }
      else
        for (int64_t k = 0; k < slots; ++k) {
          const int32_t i = idx[k];
          o[k] = i >= 0 ? sc[i] : 0.f;
        }
      std::fill(o + slots, o + l.qr, 0.f);
    }
  }
}

// y[n, c, oy, ox] = output (oy % m, ox % m) of channel c's tile at slot (oy / m, ox / m) (+
// bias[c], then max(., 0) when relu); t [channels][m * m][l.qr].
template <int M>
void unstack_tiles(const float* __restrict t, const float* bias, bool relu,
                                                 int64_t channels, const Plan& l, const int32_t* __restrict out_map,
                                                 float* __restrict y) {
  const int64_t plane = l.h * l.w, tiles = l.th * l.tw;
  for (int64_t n = 0; n < l.nb; ++n)
    for (int64_t c = 0; c < channels; ++c) {
      const float bc = bias ? bias[c] : 0.f;
      const float* tc = t + c * M * M * l.qr + n * tiles;
      float* yc = y + (n * channels + c) * plane;
      if (relu)
        for (int64_t k = 0; k < plane; ++k) yc[k] = std::max(tc[out_map[k]] + bc, 0.f);
      else
        for (int64_t k = 0; k < plane; ++k) yc[k] = tc[out_map[k]] + bc;
    }
}

using vec::load;
using vec::store;
using vec::Vec;

// out[r * os] = sum_c K[r][c] in[c * is]. Fully unrolled, K's entries are constants: the
// zero terms vanish and +-1 become additions (a 0 * x would stay, as NaN * 0 is not 0).
template <int V, int R, int C>
[[gnu::always_inline]] inline void apply(const float (&K)[R][C], const Vec<V>* in, int is, Vec<V>* out, int os) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    Vec<V> acc = {};
    bool started = false;
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      const float k = K[r][c];
      if (k == 0.f) continue;
      const Vec<V>& x = in[c * is];
      if (!started)
        acc = k == 1.f ? x : k == -1.f ? -x : k * x;
      else if (k == 1.f)
        acc += x;
      else if (k == -1.f)
        acc -= x;
      else
        acc += k * x;
      started = true;
    }
    out[r * os] = acc;
  }
}

// vb[xi * vs] (xi < a^2) = B^T d B of the input tiles at slots q.. q + V of one channel's
// stacked tiles p (qr apart).
template <int V, int M>
[[gnu::always_inline]] inline void input_transform(const float* __restrict p, const Plan& l, int64_t q,
                                                   float* __restrict vb, int64_t vs) {
  constexpr int A = M + 2;
  Vec<V> d[A][A], t[A][A];
#pragma GCC unroll 6
  for (int r = 0; r < A; ++r)
#pragma GCC unroll 6
    for (int s = 0; s < A; ++s) load<V>(d[r][s], p + (r * A + s) * l.qr + q);
#pragma GCC unroll 6
  for (int r = 0; r < A; ++r) apply<V>(Tf<M>::BT, d[r], 1, t[r], 1);  // t[r][k] = sum_s BT[k][s] d[r][s]
#pragma GCC unroll 6
  for (int k = 0; k < A; ++k) apply<V>(Tf<M>::BT, &t[0][k], A, &d[0][k], A);
#pragma GCC unroll 6
  for (int r = 0; r < A; ++r)
#pragma GCC unroll 6
    for (int s = 0; s < A; ++s) store<V>(vb + (r * A + s) * vs, d[r][s]);
}

// U [a^2][cout_r / CB][cin][CB] = G k G^T of the convolution's kernels k[o][i] (forward: w[o][i];
// flipped: w[i][o] turned by 180 degrees, the input gradient's), rows past cout zero. The taps
// go first to tmp [9][U's packed order], then V packed weights at a time through the transforms.
template <int V, int CB, int M>
[[gnu::always_inline]] inline void transform_weights(const float* w, int64_t cout, int64_t cin, bool flipped,
                                                     float* __restrict tmp, float* __restrict u) {
  constexpr int A = M + 2;
  const int64_t cout_r = round_up(cout, kChannelPad), xs = weight_stride(cout, cin);
  for (int64_t o = 0; o < cout_r; ++o)
    for (int64_t i = 0; i < cin; ++i) {
      const int64_t at = ((o / CB) * cin + i) * CB + o % CB;
      const float* src = o >= cout ? nullptr : flipped ? w + (i * cout + o) * 9 : w + (o * cin + i) * 9;
      for (int t = 0; t < 9; ++t) tmp[t * xs + at] = !src ? 0.f : flipped ? src[8 - t] : src[t];
    }
  for (int t = 0; t < 9; ++t) std::fill(tmp + t * xs + cout_r * cin, tmp + (t + 1) * xs, 0.f);
  for (int64_t p = 0; p < xs; p += V) {
    Vec<V> k[3][3], gk[A][3], uv[A][A];
#pragma GCC unroll 9
    for (int t = 0; t < 9; ++t) load<V>(k[t / 3][t % 3], tmp + t * xs + p);
#pragma GCC unroll 3
    for (int kx = 0; kx < 3; ++kx) apply<V>(Tf<M>::G, &k[0][kx], 3, &gk[0][kx], 3);
#pragma GCC unroll 6
    for (int r = 0; r < A; ++r) apply<V>(Tf<M>::G, gk[r], 1, uv[r], 1);
#pragma GCC unroll 6
    for (int r = 0; r < A; ++r)
#pragma GCC unroll 6
      for (int s = 0; s < A; ++s) store<V>(u + (r * A + s) * xs + p, uv[r][s]);
  }
}

// out[(i * m + j) * qr] = (A^T M A)[i][j] of the vectors mb[xi * ms] (xi < a^2).
template <int V, int M>
[[gnu::always_inline]] inline void output_transform(const float* __restrict mb, int64_t ms, float* __restrict out,
                                                    int64_t qr) {
  constexpr int A = M + 2;
  Vec<V> m[A][A], t[A][M], y[M][M];
#pragma GCC unroll 6
  for (int r = 0; r < A; ++r)
#pragma GCC unroll 6
    for (int s = 0; s < A; ++s) load<V>(m[r][s], mb + (r * A + s) * ms);
#pragma GCC unroll 6
  for (int r = 0; r < A; ++r) apply<V>(Tf<M>::AT, m[r], 1, t[r], 1);
#pragma GCC unroll 4
  for (int j = 0; j < M; ++j) apply<V>(Tf<M>::AT, &t[0][j], M, &y[0][j], M);
#pragma GCC unroll 4
  for (int i = 0; i < M; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < M; ++j) store<V>(out + (i * M + j) * qr, y[i][j]);
}

// mb [cout_r][T] = u [cout_r / CB][cin][CB] times vb [cin][T], T = V * NV.
template <int V, int CB, int NV>
[[gnu::always_inline]] inline void block_gemm(const float* __restrict u, const float* __restrict vb, int64_t cin,
                                              int64_t cout_r, float* __restrict mb) {
  constexpr int64_t T = V * NV;
  for (int64_t o0 = 0; o0 < cout_r; o0 += CB) {
    const float* wb = u + o0 * cin;
    Vec<V> acc[CB][NV] = {};
    for (int64_t i = 0; i < cin; ++i) {
      Vec<V> xv[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) load<V>(xv[v], vb + i * T + v * V);
#pragma GCC unroll 8
      for (int j = 0; j < CB; ++j) {
        const float s = wb[i * CB + j];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[j][v] += xv[v] * s;
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < CB; ++j)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) store<V>(mb + (o0 + j) * T + v * V, acc[j][v]);
  }
}

// out [batch, cout, h, w] = the Winograd convolution of in [batch, cin, h, w] (masked where
// mask <= 0 when mask is given) with the transformed weights already in scratch. Inlined into
// each build's entry point, whose target attribute the vector code needs.
template <int V, int CB, int NV, int M>
[[gnu::always_inline]] inline void convolve(const kernels::ConvGeometry& g, int64_t batch, int64_t cin, int64_t cout, const float* in,
              const float* mask, const float* bias, bool relu, float* out, float* scratch) {
  constexpr int A = M + 2;
  constexpr int64_t T = V * NV;
  static_assert(kBlock % T == 0);
  const ScratchPlan sp(g, M, cin, cout, batch);
  float *tiles = scratch, *outp = scratch + sp.out, *vb = scratch + sp.vb, *mb = scratch + sp.mb;
  const float* u = scratch + sp.u;
  const int64_t cout_r = round_up(cout, kChannelPad), plane = g.h * g.w;
  const int64_t vs = cin * T + kSkew, ms = cout_r * T + kSkew;  // V's and M's matrices apart
  const int64_t chunk = chunk_images(g, M, cin, cout, batch);
  std::vector<int32_t> in_map, out_map;
  for (int64_t n0 = 0; n0 < batch; n0 += chunk) {
    const Plan l(g, M, std::min(chunk, batch - n0));
    if (n0 == 0 || l.nb < chunk) build_maps<M>(l, cin, in_map, out_map);  // the first and the short last chunk
    stack_tiles<M>(in + n0 * cin * plane, mask ? mask + n0 * cin * plane : nullptr, cin, l, in_map.data(), tiles);
    for (int64_t q0 = 0; q0 < l.qr; q0 += T) {
      for (int64_t i = 0; i < cin; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v)
          input_transform<V, M>(tiles + i * A * A * l.qr, l, q0 + v * V, vb + i * T + v * V, vs);
      for (int xi = 0; xi < A * A; ++xi)
        block_gemm<V, CB, NV>(u + xi * weight_stride(cout, cin), vb + xi * vs, cin, cout_r, mb + xi * ms);
      for (int64_t o = 0; o < cout; ++o)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v)
          output_transform<V, M>(mb + o * T + v * V, ms, outp + o * M * M * l.qr + q0 + v * V, l.qr);
    }
    unstack_tiles<M>(outp, bias, relu, cout, l, out_map.data(), out + n0 * cout * plane);
  }
}

template <int V, int CB, int NV, int M>
[[gnu::always_inline]] inline void forward_impl(const WinogradConv& d, const float* x, const float* w,
                                                const float* bias, bool relu, float* y, float* scratch) {
  const ScratchPlan sp(d.g, M, d.g.c, d.out_c, d.batch);
  transform_weights<V, CB, M>(w, d.out_c, d.g.c, false, scratch + sp.ut, scratch + sp.u);
  convolve<V, CB, NV, M>(d.g, d.batch, d.g.c, d.out_c, x, nullptr, bias, relu, y, scratch);
}

template <int V, int CB, int NV, int M>
[[gnu::always_inline]] inline void input_grad_impl(const WinogradConv& d, const float* w, const float* dy,
                                                   const float* relu_output, float* dx, float* scratch) {
  const ScratchPlan sp(d.g, M, d.out_c, d.g.c, d.batch);
  transform_weights<V, CB, M>(w, d.g.c, d.out_c, true, scratch + sp.ut, scratch + sp.u);
  convolve<V, CB, NV, M>(d.g, d.batch, d.out_c, d.g.c, dy, relu_output, nullptr, false, dx, scratch);
}

using ForwardFn = void (*)(const WinogradConv&, const float*, const float*, const float*, bool, float*, float*);
using InputGradFn = void (*)(const WinogradConv&, const float*, const float*, const float*, float*, float*);
struct Impl {
  ForwardFn forward;
  InputGradFn input_grad;
  const char* name;
};

#define DTRAIN_WINOGRAD_IMPL(NAME, TARGET, V, CB, NV)                                                            \
  TARGET void forward_##NAME(const WinogradConv& d, const float* x, const float* w, const float* bias, bool relu, \
                             float* y, float* scratch) {                                                          \
    if (d.m == 4)                                                                                                 \
      forward_impl<V, CB, NV, 4>(d, x, w, bias, relu, y, scratch);                                                \
    else                                                                                                          \
      forward_impl<V, CB, NV, 2>(d, x, w, bias, relu, y, scratch);                                                \
  }                                                                                                               \
  TARGET void input_grad_##NAME(const WinogradConv& d, const float* w, const float* dy, const float* relu_output, \
                                float* dx, float* scratch) {                                                      \
    if (d.m == 4)                                                                                                 \
      input_grad_impl<V, CB, NV, 4>(d, w, dy, relu_output, dx, scratch);                                          \
    else                                                                                                          \
      input_grad_impl<V, CB, NV, 2>(d, w, dy, relu_output, dx, scratch);                                          \
  }

DTRAIN_WINOGRAD_IMPL(generic, , 4, 4, 2)
#if defined(__x86_64__) && defined(__GNUC__)
DTRAIN_WINOGRAD_IMPL(avx2, __attribute__((target("avx2,fma"))), 8, 4, 3)
DTRAIN_WINOGRAD_IMPL(avx512, __attribute__((target("avx512f,avx512vl,avx2,fma"))), 16, 8, 3)
#endif
#undef DTRAIN_WINOGRAD_IMPL

// The builds this CPU runs, best first.
std::vector<Impl> supported() {
#if defined(__x86_64__) && defined(__GNUC__)
  return vec::runnable_builds<Impl>({forward_avx512, input_grad_avx512, "avx512"},
                                    {forward_avx2, input_grad_avx2, "avx2"},
                                    {forward_generic, input_grad_generic, "generic"});
#else
  return {{forward_generic, input_grad_generic, "generic"}};
#endif
}

Impl& impl() {
  static Impl chosen = supported().front();
  return chosen;
}

}  // namespace

bool winograd_fits(const kernels::ConvGeometry& g) {
  return g.kh == 3 && g.kw == 3 && g.pad == 1 && g.stride == 1 && g.oh == g.h && g.ow == g.w;
}

// Note [Winograd tile rule]: planes of at most 8x8 with 64 channels or more on both sides
// (ResNet-18's layer3 and layer4 at width 16): F(4x4) on 7x7 (two tiles a side, 36 products per
// 16 outputs), F(2x2) on 4x4 (F(4x4)'s single tile a 4x4 image leaves most of a block's lanes
// empty at these batch chunks); the direct kernels everywhere else, where they measured faster
// (Note [Winograd CPU convolution]).
int winograd_tile(const kernels::ConvGeometry& g, int64_t out_c) {
  const bool small_plane = g.h <= 8 && g.w <= 8, wide = g.c >= 64 && out_c >= 64;
  if (!winograd_fits(g) || !small_plane || !wide) return 0;
  return g.h > 4 || g.w > 4 ? 4 : 2;
}

int64_t winograd_conv_scratch_floats(const WinogradConv& d) {
  return std::max(ScratchPlan(d.g, d.m, d.g.c, d.out_c, d.batch).total,
                  ScratchPlan(d.g, d.m, d.out_c, d.g.c, d.batch).total);
}

void winograd_conv_forward(const WinogradConv& d, const float* x, const float* w, const float* bias, bool relu,
                           float* y, float* scratch) {
  impl().forward(d, x, w, bias, relu, y, scratch);
}

void winograd_conv_input_grad(const WinogradConv& d, const float* w, const float* dy, const float* relu_output,
                              float* dx, float* scratch) {
  impl().input_grad(d, w, dy, relu_output, dx, scratch);
}

const char* winograd_conv_isa() { return impl().name; }

bool select_winograd_conv_isa(std::string_view name) { return vec::select_build(supported(), name, impl()); }

}  // namespace dtrain::cpu
