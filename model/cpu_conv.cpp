// The CPU loops of model/cpu_conv.h.
//
// Note [CPU convolution]
// ~~~~~~~~~~~~~~~~~~~~~~
// The device-generic functors decode (n, c, y, x) from a flat index with a chain of divisions
// for every element: right for a GPU thread, and 41% of a CNN step on the CPU (issue 14). These
// loops walk the same layouts row by row instead: for a kernel tap (ci, ky, kx) and an output
// row oy, the im2col row is a strided copy of one input row with zeros at the edges, so the
// inner loops are contiguous and vectorise, and the padding is decided once per row, not per
// element. col2im is the same walk as a scatter-add; max-pool backward scatters through the
// argmax that forward records. The bias, a ReLU that follows the layer, and the move from the
// GEMM's [channel, sample*pixel] layout to NCHW share one pass after the GEMM; backward's move
// back shares its pass with the ReLU mask and the bias gradient. Two shapes of ResNet's take
// other walks (issue 24): with stride 1 and the output as large as the input (3x3 padding 1) a
// tap's plane is the input plane shifted, so im2col copies and col2im adds one run per tap and
// plane instead of one per output row (flat taps); strided windows and planes of 64 pixels or
// fewer gather through a table of source indices (im2col only). Conv2d calls these a chunk of
// images at a time on the CPU (Note [Chunked CPU convolution] in conv.cpp).
//
// Libraries weighed (a one-off comparison and bench/kernel_bench.cpp on this 2-core AMD EPYC,
// AVX2, 1 thread, batch 64, best of 30 runs; the machine was shared, so ratios, not times):
// - oneDNN 2.6 (PyTorch's CPU convolution; jit:avx2 here): forward with ReLU 1.00 ms for conv1
//   (1->6 channels, 5x5, 28x28) and 0.71 ms for conv2 (6->16, 5x5, 14x14) against 1.06 and 1.79
//   ms for these loops with OpenBLAS, but backward-weights 3.31 and 1.04 ms and backward-data
//   0.97 ms (conv2) against 1.20, 0.78 and 1.59 ms: oneDNN wants blocked layouts (nChw8c), so
//   NCHW tensors pay a reorder both ways on every call. Keeping every activation blocked would
//   take pooling, ReLU and the first Linear into oneDNN too, beside a second layout for the GPU.
// - BLIS 0.9: the convolutions' GEMMs are skinny (6 or 16 rows), where it ran 31-62 GFLOP/s
//   against OpenBLAS's 11-45, so dtrain sends them to BLIS (Note [Two CPU GEMM libraries] in
//   core/ops.cpp). These loops with BLIS then took 0.97 + 0.77 ms for conv1 (forward +
//   backward-weights) and 1.27 + 0.61 + 1.31 ms for conv2 (+ backward-data): 4.9 ms against
//   oneDNN's 7.0. oneDNN stays ahead on conv2's forward and backward-data (0.71 and 0.97 ms);
//   taking it for that layer alone would save about 0.5 ms of a ~7 ms step for a 40 MB library
//   with its own OpenMP runtime, so it is not used.
// Max pooling: the 2x2 stride-2 windows of LeNet-style nets vectorise across a row of outputs
// (each maximum kept in registers; a conditional store back to memory compiles to a masked
// store, slow on AMD); other shapes and the padded edges take a branch-free scalar loop. Forward
// records the argmax, so backward is a scatter.
#include "model/cpu_conv.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace dtrain::cpu {

namespace {

int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// [lo, hi): the outputs o < out whose input o*stride - pad + tap lies inside [0, size).
struct Range {
  int64_t lo, hi;
};
Range inside(int64_t tap, int64_t size, int64_t out, int64_t stride, int64_t pad) {
  const int64_t lo = std::min(out, pad > tap ? (pad - tap + stride - 1) / stride : int64_t{0});
  const int64_t hi = std::clamp(floor_div(size - 1 + pad - tap, stride) + 1, lo, out);
  return {lo, hi};
}

// out[ox] = in[ox*stride + base] on [r.lo, r.hi), zero elsewhere in [0, ow).
inline void copy_row(float* __restrict out, const float* __restrict in, int64_t base, Range r, int64_t ow,
                     int64_t stride) {
  for (int64_t ox = 0; ox < r.lo; ++ox) out[ox] = 0.f;
  if (stride == 1) {
    for (int64_t ox = r.lo; ox < r.hi; ++ox) out[ox] = in[base + ox];
  } else {
    for (int64_t ox = r.lo; ox < r.hi; ++ox) out[ox] = in[base + ox * stride];
  }
  for (int64_t ox = r.hi; ox < ow; ++ox) out[ox] = 0.f;
}

// acc[ox*stride + base] += in[ox] on [r.lo, r.hi).
inline void add_row(float* __restrict acc, const float* __restrict in, int64_t base, Range r, int64_t stride) {
  if (stride == 1) {
    for (int64_t ox = r.lo; ox < r.hi; ++ox) acc[base + ox] += in[ox];
  } else {
    for (int64_t ox = r.lo; ox < r.hi; ++ox) acc[base + ox * stride] += in[ox];
  }
}

}  // namespace

DTRAIN_CPU_CLONES float lane_sum(const float* x, int64_t n) {
  float lanes[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) lanes[j] += x[i + j];
  for (; i < n; ++i) lanes[0] += x[i];
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

namespace {

// Stride 1 with the output as large as the input (ResNet's 3x3 padding 1): a tap's whole plane
// is the input plane shifted by one offset, so the rows the tap reads inside the image are one
// contiguous run (one copy or one add loop, not one short loop per output row), and only the
// padding columns the run wraps into need zeros (Note [CPU convolution]).
bool flat_taps(const kernels::ConvGeometry& g) { return g.stride == 1 && g.ow == g.w && g.oh == g.h; }

// A tap's run: output indices [first, last), input index = output index + offset.
struct FlatTap {
  Range ry, rx;
  int64_t first, last, offset;
};
FlatTap flat_tap(const kernels::ConvGeometry& g, int64_t ky, int64_t kx) {
  FlatTap t{inside(ky, g.h, g.oh, 1, g.pad), inside(kx, g.w, g.ow, 1, g.pad), 0, 0, (ky - g.pad) * g.w + kx - g.pad};
  if (t.ry.lo < t.ry.hi && t.rx.lo < t.rx.hi) {
    t.first = t.ry.lo * g.ow + t.rx.lo;
    t.last = (t.ry.hi - 1) * g.ow + t.rx.hi;
  }
  return t;
}

// out[oy, ox] = 0 for ox outside [rx.lo, rx.hi) in rows [ry.lo, ry.hi): the elements a run wraps into.
inline void zero_edges(float* out, const FlatTap& t, int64_t ow) {
  for (int64_t oy = t.ry.lo; oy < t.ry.hi; ++oy) {
    for (int64_t ox = 0; ox < t.rx.lo; ++ox) out[oy * ow + ox] = 0.f;
    for (int64_t ox = t.rx.hi; ox < ow; ++ox) out[oy * ow + ox] = 0.f;
  }
}

// im2col of strided windows (ResNet's stride-2 downsampling) and of small planes (its 7x7 and
// 4x4 layers): per output row the loops copy a handful of elements, one at a time with a
// stride, or call memcpy/memset for a few, and the per-row and per-call overheads dominated.
// There each tap's source index per output pixel is tabulated once per call and a plane is one
// gather over the table, without a branch: the plane is staged in a copy with one more
// element, a zero, which the padding's entries index. (The same scatter for col2im was slower
// than its row loops: 10% of a ResNet-18 step against 7%, the adds into the staged plane
// serialised through memory.)
constexpr int64_t kSmallPlane = 64;
bool tabulated_taps(const kernels::ConvGeometry& g) {
  return g.stride > 1 || (flat_taps(g) && g.oh * g.ow <= kSmallPlane);
}

// [kh*kw][plane]: the input index in one channel's plane that output pixel p reads for tap
// (ky, kx), or h*w (the staged plane's extra element) where that lies in the padding.
std::vector<int32_t> tap_table(const kernels::ConvGeometry& g) {
  const int64_t plane = g.oh * g.ow;
  std::vector<int32_t> table(static_cast<size_t>(g.kh * g.kw * plane), static_cast<int32_t>(g.h * g.w));
  for (int64_t ky = 0; ky < g.kh; ++ky)
    for (int64_t kx = 0; kx < g.kw; ++kx) {
      int32_t* t = table.data() + (ky * g.kw + kx) * plane;
      const Range ry = inside(ky, g.h, g.oh, g.stride, g.pad), rx = inside(kx, g.w, g.ow, g.stride, g.pad);
      for (int64_t oy = ry.lo; oy < ry.hi; ++oy)
        for (int64_t ox = rx.lo; ox < rx.hi; ++ox)
          t[oy * g.ow + ox] = static_cast<int32_t>((oy * g.stride - g.pad + ky) * g.w + ox * g.stride - g.pad + kx);
    }
  return table;
}

}  // namespace

DTRAIN_CPU_CLONES void im2col(const float* x, const kernels::ConvGeometry& g, int64_t batch, float* col) {
  const int64_t plane = g.oh * g.ow, ncols = batch * plane, in_plane = g.h * g.w;
  if (tabulated_taps(g)) {
    const std::vector<int32_t> table = tap_table(g);
    std::vector<float> staged(static_cast<size_t>(in_plane + 1), 0.f);  // the last stays 0
    for (int64_t ci = 0; ci < g.c; ++ci)
      for (int64_t n = 0; n < batch; ++n) {
        std::memcpy(staged.data(), x + (n * g.c + ci) * in_plane, sizeof(float) * static_cast<size_t>(in_plane));
        const float* __restrict xs = staged.data();
        for (int64_t tap = 0; tap < g.kh * g.kw; ++tap) {
          const int32_t* __restrict t = table.data() + tap * plane;
          float* __restrict out = col + (ci * g.kh * g.kw + tap) * ncols + n * plane;
          for (int64_t p = 0; p < plane; ++p) out[p] = xs[t[p]];
        }
      }
    return;
  }
  if (flat_taps(g)) {
    for (int64_t ci = 0; ci < g.c; ++ci)
      for (int64_t ky = 0; ky < g.kh; ++ky)
        for (int64_t kx = 0; kx < g.kw; ++kx) {
          const FlatTap t = flat_tap(g, ky, kx);
          float* row = col + ((ci * g.kh + ky) * g.kw + kx) * ncols;
          for (int64_t n = 0; n < batch; ++n) {
            const float* xc = x + (n * g.c + ci) * in_plane;
            float* out = row + n * plane;
            std::fill(out, out + t.first, 0.f);
            std::memcpy(out + t.first, xc + t.first + t.offset, sizeof(float) * static_cast<size_t>(t.last - t.first));
            std::fill(out + t.last, out + plane, 0.f);
            zero_edges(out, t, g.ow);
          }
        }
    return;
  }
  for (int64_t ci = 0; ci < g.c; ++ci)
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      const Range ry = inside(ky, g.h, g.oh, g.stride, g.pad);
      for (int64_t kx = 0; kx < g.kw; ++kx) {
        const Range rx = inside(kx, g.w, g.ow, g.stride, g.pad);
        float* row = col + ((ci * g.kh + ky) * g.kw + kx) * ncols;
        for (int64_t n = 0; n < batch; ++n) {
          const float* xc = x + (n * g.c + ci) * in_plane;
          float* out = row + n * plane;
          std::fill(out, out + ry.lo * g.ow, 0.f);  // output rows whose tap lies in the top padding
          for (int64_t oy = ry.lo; oy < ry.hi; ++oy)
            copy_row(out + oy * g.ow, xc, (oy * g.stride - g.pad + ky) * g.w - g.pad + kx, rx, g.ow, g.stride);
          std::fill(out + ry.hi * g.ow, out + plane, 0.f);  // ... and in the bottom padding
        }
      }
    }
}

DTRAIN_CPU_CLONES void col2im(float* col, const kernels::ConvGeometry& g, int64_t batch, float* dx) {
  const int64_t plane = g.oh * g.ow, ncols = batch * plane, in_plane = g.h * g.w;
  std::memset(dx, 0, sizeof(float) * static_cast<size_t>(batch * g.c * in_plane));
  if (flat_taps(g)) {
    // A tap's run is added in one loop once its wrapped elements are zero in col: adding +0
    // changes no sum here (each starts from +0, so none is ever -0), and every pixel still
    // receives its taps in (ky, kx) order.
    for (int64_t ci = 0; ci < g.c; ++ci)
      for (int64_t n = 0; n < batch; ++n) {
        float* __restrict xc = dx + (n * g.c + ci) * in_plane;
        for (int64_t ky = 0; ky < g.kh; ++ky)
          for (int64_t kx = 0; kx < g.kw; ++kx) {
            const FlatTap t = flat_tap(g, ky, kx);
            float* __restrict in = col + ((ci * g.kh + ky) * g.kw + kx) * ncols + n * plane;
            zero_edges(in, t, g.ow);
            for (int64_t i = t.first; i < t.last; ++i) xc[i + t.offset] += in[i];
          }
      }
    return;
  }
  // Samples in blocks whose input gradient (one channel) fits in L1, taps outside the samples
  // of a block: each column row is read in long runs, front to back, and every pixel still
  // receives its taps in (ky, kx) order.
  const int64_t block = std::max<int64_t>(1, (16 << 10) / static_cast<int64_t>(sizeof(float) * in_plane));
  for (int64_t ci = 0; ci < g.c; ++ci)
    for (int64_t n0 = 0; n0 < batch; n0 += block) {
      const int64_t n1 = std::min(batch, n0 + block);
      for (int64_t ky = 0; ky < g.kh; ++ky) {
        const Range ry = inside(ky, g.h, g.oh, g.stride, g.pad);
        for (int64_t kx = 0; kx < g.kw; ++kx) {
          const Range rx = inside(kx, g.w, g.ow, g.stride, g.pad);
          const float* row = col + ((ci * g.kh + ky) * g.kw + kx) * ncols;
          for (int64_t n = n0; n < n1; ++n) {
            float* xc = dx + (n * g.c + ci) * in_plane;
            const float* in = row + n * plane;
            for (int64_t oy = ry.lo; oy < ry.hi; ++oy)
              add_row(xc, in + oy * g.ow, (oy * g.stride - g.pad + ky) * g.w - g.pad + kx, rx, g.stride);
          }
        }
      }
    }
}

namespace {

// dst[p] = src[p] + b, then max(., 0) when relu. dst may be src (in place): no iteration reads
// what another writes, which ivdep tells the vectoriser.
inline void plane_bias_relu(const float* src, float* dst, float b, int64_t plane, bool relu) {
  if (relu) {
#pragma GCC ivdep
    for (int64_t p = 0; p < plane; ++p) {
      const float v = src[p] + b;
      dst[p] = v > 0.f ? v : 0.f;
    }
  } else {
#pragma GCC ivdep
    for (int64_t p = 0; p < plane; ++p) dst[p] = src[p] + b;
  }
}

}  // namespace

DTRAIN_CPU_CLONES void columns_to_nchw_bias(const float* yc, const float* bias, int64_t batch, int64_t channels,
                                            int64_t plane, bool relu, float* y) {
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t c = 0; c < channels; ++c)
      plane_bias_relu(yc + (c * batch + n) * plane, y + (n * channels + c) * plane, bias ? bias[c] : 0.f, plane, relu);
}

DTRAIN_CPU_CLONES void bias_relu(float* y, const float* bias, int64_t channels, int64_t plane, bool relu) {
  if (!bias && !relu) return;
  for (int64_t c = 0; c < channels; ++c) plane_bias_relu(y + c * plane, y + c * plane, bias ? bias[c] : 0.f, plane, relu);
}

DTRAIN_CPU_CLONES void nchw_to_columns(const float* dy, const float* relu_output, int64_t batch, int64_t channels,
                                       int64_t plane, float* dyc, float* db, float db_beta) {
  for (int64_t c = 0; c < channels; ++c) {
    float total = 0.f;
    for (int64_t n = 0; n < batch; ++n) {
      const float* __restrict src = dy + (n * channels + c) * plane;
      float* __restrict dst = dyc + (c * batch + n) * plane;
      if (relu_output) {
        const float* __restrict y = relu_output + (n * channels + c) * plane;
        for (int64_t p = 0; p < plane; ++p) dst[p] = y[p] > 0.f ? src[p] : 0.f;
      } else {
        for (int64_t p = 0; p < plane; ++p) dst[p] = src[p];
      }
      if (db) total += lane_sum(dst, plane);
    }
    if (db) db[c] = db_beta == 0.f ? total : db[c] + total;  // not beta * db: stale memory may hold NaN
  }
}

DTRAIN_CPU_CLONES void transpose_into(const float* t, int64_t rows, int64_t cols, float* out, float beta) {
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r) out[c * rows + r] = beta == 0.f ? t[r * cols + c] : out[c * rows + r] + t[r * cols + c];
}

namespace {

// One output of max-pool: the reference's taps in its order and its test (the first valid tap,
// then any strictly greater one), so NaN and ties resolve as there. Both sides of the test are
// evaluated: the compiler emits selects, not a branch the data would decide.
inline void pool_one(const float* xp, const kernels::ConvGeometry& g, int64_t y0, int64_t ky0, int64_t ky1, int64_t ox,
                     float* y, int32_t* argmax) {
  const int64_t x0 = ox * g.stride - g.pad, kx0 = std::max<int64_t>(0, -x0), kx1 = std::min(g.kw, g.w - x0);
  float best = -INFINITY;
  int32_t best_at = -1;
  for (int64_t ky = ky0; ky < ky1; ++ky)
    for (int64_t kx = kx0; kx < kx1; ++kx) {
      const int32_t at = static_cast<int32_t>((y0 + ky) * g.w + x0 + kx);
      const bool take = (xp[at] > best) | (best_at < 0);
      best = take ? xp[at] : best;
      best_at = take ? at : best_at;
    }
  *y = best;
  *argmax = best_at;
}

// The same for the outputs [lo, hi) of a row whose K x K windows (stride S) lie inside the
// image: the tap loops unroll and the loop over outputs vectorises (each output's maximum is
// kept in registers and stored once).
template <int64_t K, int64_t S>
inline void pool_inside(const float* __restrict xp, int64_t w, int64_t y0, int64_t pad, int64_t lo, int64_t hi,
                        float* __restrict yr, int32_t* __restrict ar) {
  for (int64_t ox = lo; ox < hi; ++ox) {
    const int64_t x0 = ox * S - pad;
    int32_t best_at = static_cast<int32_t>(y0 * w + x0);
    float best = xp[best_at];
    for (int64_t ky = 0; ky < K; ++ky)
      for (int64_t kx = ky == 0 ? 1 : 0; kx < K; ++kx) {
        const int32_t at = static_cast<int32_t>((y0 + ky) * w + x0 + kx);
        const bool take = xp[at] > best;
        best = take ? xp[at] : best;
        best_at = take ? at : best_at;
      }
    yr[ox] = best;
    ar[ox] = best_at;
  }
}

}  // namespace

DTRAIN_CPU_CLONES void maxpool_forward(const float* x, const kernels::ConvGeometry& g, int64_t planes, float* y,
                                       int32_t* argmax) {
  // Columns whose window lies inside the image in x: [in.lo, in.hi). The 2x2 stride-2 pooling
  // of LeNet-style nets takes the vectorised path there; every other output goes one by one.
  const Range in = {std::min(g.ow, (g.pad + g.stride - 1) / g.stride),
                    std::clamp(floor_div(g.w - g.kw + g.pad, g.stride) + 1, int64_t{0}, g.ow)};
  const bool two_by_two = g.kh == 2 && g.kw == 2 && g.stride == 2 && in.lo < in.hi;
  for (int64_t pl = 0; pl < planes; ++pl) {
    const float* xp = x + pl * g.h * g.w;
    for (int64_t oy = 0; oy < g.oh; ++oy) {
      const int64_t y0 = oy * g.stride - g.pad, ky0 = std::max<int64_t>(0, -y0), ky1 = std::min(g.kh, g.h - y0);
      float* yr = y + (pl * g.oh + oy) * g.ow;
      int32_t* ar = argmax + (pl * g.oh + oy) * g.ow;
      if (two_by_two && ky0 == 0 && ky1 == 2) {
        for (int64_t ox = 0; ox < in.lo; ++ox) pool_one(xp, g, y0, ky0, ky1, ox, yr + ox, ar + ox);
        pool_inside<2, 2>(xp, g.w, y0, g.pad, in.lo, in.hi, yr, ar);
        for (int64_t ox = in.hi; ox < g.ow; ++ox) pool_one(xp, g, y0, ky0, ky1, ox, yr + ox, ar + ox);
      } else {
        for (int64_t ox = 0; ox < g.ow; ++ox) pool_one(xp, g, y0, ky0, ky1, ox, yr + ox, ar + ox);
      }
    }
  }
}

DTRAIN_CPU_CLONES void maxpool_backward(const float* dy, const int32_t* argmax, const kernels::ConvGeometry& g,
                                        int64_t planes, float* dx) {
  const int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
  std::memset(dx, 0, sizeof(float) * static_cast<size_t>(planes * in_plane));
  for (int64_t pl = 0; pl < planes; ++pl) {
    float* dxp = dx + pl * in_plane;
    const float* dyp = dy + pl * out_plane;
    const int32_t* ap = argmax + pl * out_plane;
    for (int64_t o = out_plane - 1; o >= 0; --o)
      if (ap[o] >= 0) dxp[ap[o]] += dyp[o];
  }
}

}  // namespace dtrain::cpu
