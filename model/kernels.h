// Layer, loss and optimizer kernels as device-generic functors (see core/launch.h): the CPU
// build runs them in a loop, the CUDA build in a kernel (instantiated in
// model/cuda/model_kernels.cu). Each functor body is the single definition of its arithmetic.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/launch.h"

namespace dtrain::kernels {

// ---- Linear / elementwise ----

struct BroadcastRows {  // y[r, c] = b[c]   (bias as the GEMM's initial C)
  float* y;
  const float* b;
  int64_t cols;
  DTRAIN_HD void operator()(int64_t i) const { y[i] = b[i % cols]; }
};

struct ReluForward {
  float* y;
  const float* x;
  DTRAIN_HD void operator()(int64_t i) const { y[i] = x[i] > 0.f ? x[i] : 0.f; }
};

struct ReluBackward {  // uses the output: y > 0 exactly where x > 0
  float* dx;
  const float* dy;
  const float* y;
  DTRAIN_HD void operator()(int64_t i) const {
    const float d = dy[i];  // read whether or not masked: a conditional read compiles to a masked load
    dx[i] = y[i] > 0.f ? d : 0.f;
  }
};

// Counter-based hash (splitmix64): the same mask on every device for the same seed/counter.
DTRAIN_HD inline float uniform01(uint64_t seed, uint64_t counter) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (counter + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // 24 bits -> [0, 1)
}

struct DropoutForward {  // mask holds 0 or 1/(1-p)
  float* y;
  float* mask;
  const float* x;
  float p;
  uint64_t seed, offset;
  DTRAIN_HD void operator()(int64_t i) const {
    float m = uniform01(seed, offset + static_cast<uint64_t>(i)) < p ? 0.f : 1.f / (1.f - p);
    mask[i] = m;
    y[i] = x[i] * m;
  }
};

struct Multiply {  // y = a * b
  float* y;
  const float* a;
  const float* b;
  DTRAIN_HD void operator()(int64_t i) const { y[i] = a[i] * b[i]; }
};

// ---- Conv2d (im2col + GEMM) and MaxPool2d, NCHW ----

struct ConvGeometry {
  int64_t c, h, w;         // input channels and size
  int64_t kh, kw, stride, pad;
  int64_t oh, ow;          // output size
};

// Calls f(oy, ox, ky, kx) for every output position (oy, ox) whose window covers input pixel
// (iy, ix) through kernel tap (ky, kx): the gather that lets backward kernels avoid atomics.
template <class F>
DTRAIN_HD inline void for_each_window_over(const ConvGeometry& g, int64_t iy, int64_t ix, F&& f) {
  for (int64_t ky = 0; ky < g.kh; ++ky) {
    int64_t ty = iy + g.pad - ky;
    if (ty < 0 || ty % g.stride != 0 || ty / g.stride >= g.oh) continue;
    for (int64_t kx = 0; kx < g.kw; ++kx) {
      int64_t tx = ix + g.pad - kx;
      if (tx < 0 || tx % g.stride != 0 || tx / g.stride >= g.ow) continue;
      f(ty / g.stride, tx / g.stride, ky, kx);
    }
  }
}

// The batched layout: one column per (sample, output position), column index n*oh*ow + p, so
// one GEMM covers the whole batch. cols has in_c*kh*kw rows of batch*oh*ow columns.
struct Im2col {  // col[(ci*kh + ky)*kw + kx, n*oh*ow + oy*ow + ox] = x[n, ci, oy*s - p + ky, ox*s - p + kx]
  float* col;
  const float* x;  // [batch, c, h, w]
  ConvGeometry g;
  int64_t batch;
  DTRAIN_HD void operator()(int64_t i) const {
    // A chain of quotients: each step's / and % compile to one division (the CPU loop's cost).
    int64_t ox = i % g.ow, t = i / g.ow, oy = t % g.oh;
    t /= g.oh;
    int64_t n = t % batch, row = t / batch, kx = row % g.kw;
    row /= g.kw;
    int64_t ky = row % g.kh, ci = row / g.kh;
    int64_t iy = oy * g.stride - g.pad + ky, ix = ox * g.stride - g.pad + kx;
    col[i] = (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) ? x[((n * g.c + ci) * g.h + iy) * g.w + ix] : 0.f;
  }
};

struct Col2im {  // dx[n, ci, iy, ix] = sum of the col entries (batched layout) that read it; gather: no atomics
  float* dx;
  const float* col;
  ConvGeometry g;
  int64_t batch;
  DTRAIN_HD void operator()(int64_t i) const {
    int64_t ix = i % g.w, t = i / g.w, iy = t % g.h;
    t /= g.h;
    int64_t ci = t % g.c, n = t / g.c;
    int64_t ohw = g.oh * g.ow, ncols = batch * ohw;
    const float* cn = col + n * ohw;
    float s = 0.f;
    for_each_window_over(g, iy, ix, [&](int64_t oy, int64_t ox, int64_t ky, int64_t kx) {
      s += cn[((ci * g.kh + ky) * g.kw + kx) * ncols + oy * g.ow + ox];
    });
    dx[i] = s;
  }
};

struct ColumnsToNchwBias {  // y[n, oc, p] = yc[oc, n*plane + p] + b[oc] (b nullptr: + 0)  (GEMM result -> NCHW)
  float* y;
  const float* yc;
  const float* b;
  int64_t batch, channels, plane;
  DTRAIN_HD void operator()(int64_t i) const {
    int64_t p = i % plane, t = i / plane, oc = t % channels, n = t / channels;
    y[i] = yc[(oc * batch + n) * plane + p] + (b ? b[oc] : 0.f);
  }
};

struct NchwToColumns {  // yc[oc, n*plane + p] = y[n, oc, p]   (NCHW gradient -> GEMM operand)
  float* yc;
  const float* y;
  int64_t batch, channels, plane;
  DTRAIN_HD void operator()(int64_t i) const {
    int64_t p = i % plane, t = i / plane, n = t % batch, oc = t / batch;
    yc[i] = y[(n * channels + oc) * plane + p];
  }
};

struct MaxPoolForward {  // one output element; argmax is the input offset within its plane
  float* y;
  int32_t* argmax;
  const float* x;
  ConvGeometry g;  // c = planes (n * channels); kh = kw = kernel
  DTRAIN_HD void operator()(int64_t i) const {
    int64_t ox = i % g.ow, oy = (i / g.ow) % g.oh, plane = i / (g.ow * g.oh);
    const float* xp = x + plane * g.h * g.w;
    float best = -INFINITY;
    int32_t best_at = -1;
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      int64_t iy = oy * g.stride - g.pad + ky;
      if (iy < 0 || iy >= g.h) continue;
      for (int64_t kx = 0; kx < g.kw; ++kx) {
        int64_t ix = ox * g.stride - g.pad + kx;
        if (ix < 0 || ix >= g.w) continue;
        float v = xp[iy * g.w + ix];
        if (v > best || best_at < 0) {
          best = v;
          best_at = static_cast<int32_t>(iy * g.w + ix);
        }
      }
    }
    y[i] = best;
    argmax[i] = best_at;
  }
};

struct MaxPoolBackward {  // one input element gathers from the windows whose max it was
  float* dx;
  const float* dy;
  const int32_t* argmax;
  ConvGeometry g;
  DTRAIN_HD void operator()(int64_t i) const {
    int64_t ix = i % g.w, iy = (i / g.w) % g.h, plane = i / (g.w * g.h);
    int32_t self = static_cast<int32_t>(iy * g.w + ix);
    float s = 0.f;
    for_each_window_over(g, iy, ix, [&](int64_t oy, int64_t ox, int64_t, int64_t) {
      int64_t o = (plane * g.oh + oy) * g.ow + ox;
      if (argmax[o] == self) s += dy[o];
    });
    dx[i] = s;
  }
};

// ---- Cross-entropy: log-softmax fused, max-subtracted for stability ----

struct CrossEntropyRows {  // per row: loss_w[r] = w[y]*(-log softmax[y]), weight[r] = w[y],
  float* grad;             // grad[r, :] = w[y] * (softmax - onehot(y)) [* *scale]
  float* row_loss;
  float* row_weight;
  const float* logits;
  const int32_t* labels;
  const float* class_weight;  // nullptr: all ones
  int64_t classes;
  const float* scale = nullptr;  // the gradient's scale on the device (CrossEntropyScale); nullptr: 1
  template <class Lanes>         // a row kernel: Note [Row launches] (core/launch.h)
  DTRAIN_HD void operator()(const Lanes& lanes, int64_t r) const {
    const float* z = logits + r * classes;
    float* g = grad + r * classes;
    int32_t y = labels[r];
    if (y < 0 || y >= classes) {  // the data layer validates labels; never index out of bounds
      if (lanes.lane() == 0) {
        row_loss[r] = NAN;
        row_weight[r] = 0.f;
      }
      for (int64_t c = lanes.lane(); c < classes; c += lanes.count()) g[c] = 0.f;
      return;
    }
    float m = z[0];
    for (int64_t c = 1 + lanes.lane(); c < classes; c += lanes.count()) m = z[c] > m ? z[c] : m;
    m = lanes.max(m);
    float sum = 0.f;
    for (int64_t c = lanes.lane(); c < classes; c += lanes.count()) sum += expf(z[c] - m);
    float log_sum = logf(lanes.sum(sum));
    float w = class_weight ? class_weight[y] : 1.f;
    const float s = scale ? *scale : 1.f;
    for (int64_t c = lanes.lane(); c < classes; c += lanes.count()) {
      const float unscaled = w * (expf(z[c] - m - log_sum) - (c == y ? 1.f : 0.f));
      g[c] = scale ? unscaled * s : unscaled;  // one rounding more only when scaled, as a pass of its own
    }
    if (lanes.lane() == 0) {
      row_loss[r] = w * (log_sum + m - z[y]);
      row_weight[r] = w;
    }
  }
};

// One thread: out[1] = the gradient's scale, from the labels alone (1 / the summed class weights
// of the rows' labels for the mean, else 1), summed in row order as CrossEntropyTotal sums the row
// weights, so the same float; CrossEntropyRows then scales as it writes, with no pass of its own
// over the [rows, classes] gradient.
struct CrossEntropyScale {
  float* out;
  const int32_t* labels;
  const float* class_weight;  // nullptr: all ones
  int64_t rows, classes;
  bool mean;
  DTRAIN_HD void operator()(int64_t) const {
    float w = 0.f;
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t y = labels[r];
      w += (y < 0 || y >= classes) ? 0.f : (class_weight ? class_weight[y] : 1.f);
    }
    out[1] = mean ? (w > 0.f ? 1.f / w : 0.f) : 1.f;
  }
};


struct CrossEntropyTotal {  // one thread: out[0] = loss (mean or sum), out[1] = grad scale
  float* out;
  const float* row_loss;
  const float* row_weight;
  int64_t rows;
  bool mean;
  DTRAIN_HD void operator()(int64_t) const {
    float l = 0.f, w = 0.f;
    for (int64_t r = 0; r < rows; ++r) {
      l += row_loss[r];
      w += row_weight[r];
    }
    float s = mean ? (w > 0.f ? 1.f / w : 0.f) : 1.f;
    out[0] = l * s;
    out[1] = s;
  }
};

struct ScaleByDeviceScalar {  // y *= *s (the scale lives on the device: no host round trip)
  float* y;
  const float* s;
  DTRAIN_HD void operator()(int64_t i) const { y[i] *= *s; }
};

struct ArgmaxEquals {  // hit[r] = 1 if argmax(logits[r]) == labels[r]
  float* hit;
  const float* logits;
  const int32_t* labels;
  int64_t classes;
  DTRAIN_HD void operator()(int64_t r) const {
    const float* z = logits + r * classes;
    int64_t best = 0;
    for (int64_t c = 1; c < classes; ++c) best = z[c] > z[best] ? c : best;
    hit[r] = best == labels[r] ? 1.f : 0.f;
  }
};

// ---- Optimizers (PyTorch's update rules) ----

// PyTorch's SGD with the per-step choices folded into coefficients by the host (branch-free,
// so the CPU loop vectorises): d = g + wd p; b = buf_keep buf + grad_keep d (first step:
// 0 and 1, i.e. b = d; later: momentum and 1 - dampening); p -= lr (step_d d + step_b b)
// (Nesterov: 1 and momentum; plain momentum: 0 and 1). buf == nullptr: no momentum, p -= lr d.
// The 0/1 coefficients multiply exactly, so results equal the branching form's.
struct SgdUpdate {
  float* p;
  const float* g;
  float* buf;
  float lr, weight_decay, buf_keep, grad_keep, step_d, step_b;
  DTRAIN_HD void operator()(int64_t i) const {
    const float d = g[i] + weight_decay * p[i];
    if (!buf) {
      p[i] -= lr * d;
      return;
    }
    const float b = buf_keep * buf[i] + grad_keep * d;
    buf[i] = b;
    p[i] -= lr * (step_d * d + step_b * b);
  }
};

// PyTorch's AdamW (torch.optim.AdamW, single-tensor path), operation for operation: the
// scalars are computed in double on the host, from the hyper-parameters as written (0.999, not
// the float 0.99899999797), and rounded to float once, as PyTorch passes them to its kernels.
// Computing 1 - beta2 in float instead gives 0.000999987 where PyTorch has 0.001, a 1.3e-5
// relative bias in every second moment (and 1 - beta1 2.4e-7 off): after 200 steps the biases
// of the seed MLP were 6.6e-7 and 5.0e-7 (relative) from PyTorch's, now 4.0e-7 and 1.7e-7
// (tests/torch/agreement_test.py).
struct AdamWUpdate {
  float* p;
  const float* g;
  float* m;
  float* v;
  float decay;            // 1 - lr * weight_decay
  float beta1, beta2;
  float one_minus_beta1, one_minus_beta2;
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  float eps;
  float neg_step_size;  // -lr / (1 - beta1^t)
  DTRAIN_HD void operator()(int64_t i) const {
    p[i] *= decay;
    const float mi = m[i] * beta1 + one_minus_beta1 * g[i];
    const float vi = v[i] * beta2 + one_minus_beta2 * g[i] * g[i];
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) / bias_correction2_sqrt + eps;
    p[i] += neg_step_size * mi / denom;
  }
};

}  // namespace dtrain::kernels
