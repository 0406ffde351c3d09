// BatchNorm, global average pooling and the residual join as device-generic functors (see
// core/launch.h; CUDA instantiations in model/cuda/norm_kernels.cu). Activations are
// [batch, channels, plane] (NCHW with plane = H*W; BatchNorm1d's [N, C] has plane 1).
//
// Note [BatchNorm arithmetic]: PyTorch's CPU kernels (aten/src/ATen/native/cpu/
// batch_norm_kernel.cpp) step by step, so that 50 steps stay within 1e-4 of the peer: the
// per-channel sums in double (its accumulate type for float on the CPU), the mean and the sum of
// squared deviations about it without E[x^2] - E[x]^2's cancellation (on the CPU in one pass
// about a shift: Note [Shifted statistics]); the
// output as x * alpha + shift with alpha = invstd * weight and shift = bias - mean * alpha; the
// running statistics as momentum * batch + (1 - momentum) * running, the variance unbiased
// (n / (n - 1)); backward from sum(dy) and sum((x - mean) dy). The per-channel reductions are
// row kernels (Note [Row launches]): on the CPU one lane, in order; on a GPU each of a warp's 32
// lanes sums its share in double and the lanes are combined in float, so a GPU's sums are close
// to the CPU's, not the same bits.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/launch.h"

namespace dtrain::kernels {

// The double sum of f(p) over p in [0, n) in four interleaved partial sums, combined at the end:
// four chains of additions instead of one, so the CPU is not waiting on each addition's latency
// (a double sum; its order does not matter at float32's precision).
template <class F>
DTRAIN_HD inline double sum4(int64_t n, F&& f) {
  double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
  int64_t p = 0;
  for (; p + 4 <= n; p += 4) {
    s0 += f(p);
    s1 += f(p + 1);
    s2 += f(p + 2);
    s3 += f(p + 3);
  }
  for (; p < n; ++p) s0 += f(p);
  return (s0 + s1) + (s2 + s3);
}

// The sum of f(n, p) over a channel's batch x plane values, in a row kernel (Note [Row launches]
// in core/launch.h: a channel is a row): on the CPU's one lane every plane by sum4, in double;
// on a GPU warp each lane its share of every plane in double, the lanes' partial sums then
// combined (in float, each already summed in double).
template <class Lanes, class F>
DTRAIN_HD inline double channel_sum(const Lanes& lanes, int64_t batch, int64_t plane, const F& f) {
  double s = 0.0;
  if (lanes.count() == 1) {
    for (int64_t n = 0; n < batch; ++n) s += sum4(plane, [&](int64_t p) { return f(n, p); });
    return s;
  }
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t p = lanes.lane(); p < plane; p += lanes.count()) s += f(n, p);
  return static_cast<double>(lanes.sum(static_cast<float>(s)));
}

// One channel c (a row kernel: launch_rows over the channels): the batch's mean and
// 1/sqrt(var + eps), the affine transform folded into alpha[c] and shift[c], and
// (running_mean != nullptr) the running statistics updated.
struct BatchNormStats {
  float* mean;          // [C]
  float* invstd;        // [C]
  float* alpha;         // [C]
  float* shift;         // [C]
  float* running_mean;  // [C] or nullptr
  float* running_var;   // [C]
  const float* x;       // [N, C, plane]
  const float* weight;  // [C]
  const float* bias;    // [C]
  int64_t batch, channels, plane;
  float eps, momentum;
  // [3C] or nullptr: SyncBatchNorm's mean remainder, biased variance and its remainder
  // (Note [SyncBatchNorm statistics]).
  float* low = nullptr;
  template <class Lanes>
  DTRAIN_HD void operator()(const Lanes& lanes, int64_t c) const {
    auto at = [&](int64_t n, int64_t p) { return static_cast<double>(x[(n * channels + c) * plane + p]); };
    const double count = static_cast<double>(batch * plane);
    if (lanes.count() == 1) {  // Note [Shifted statistics]
      const double k = count > 0.0 ? at(0, 0) : 0.0;
      const double s1 = channel_sum(lanes, batch, plane, [&](int64_t n, int64_t p) { return at(n, p) - k; });
      const double s2 = channel_sum(lanes, batch, plane, [&](int64_t n, int64_t p) {
        const double d = at(n, p) - k;
        return d * d;
      });
      finish(c, k + s1 / count, shifted_squares(s1, s2, count));
      return;
    }
    const double m = channel_sum(lanes, batch, plane, at) / count;
    const double squares = channel_sum(lanes, batch, plane, [&](int64_t n, int64_t p) {
      const double d = at(n, p) - m;
      return d * d;
    });
    if (lanes.lane() == 0) finish(c, m, squares);
  }
  // Note [Shifted statistics]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~
  // The mean, then the squared deviations about it, read the input twice; on the CPU, where
  // these passes are memory-bound (issue 24: 2.3% of a ResNet-18 step), one pass sums d = x - k
  // and d^2 about k = the channel's first value: mean = k + s1/n, sum (x - mean)^2 = s2 - s1^2/n.
  // About k the cancellation E[x^2] - E[x]^2 would suffer is only ((mean - k)^2 + var) / var,
  // about 2 for a typical k drawn from the channel's values and at most n + 1 for an outlier
  // (x - k is exact in double), so the double results are within ~1e-15 (1e-16 (n + 1) at worst)
  // of the two passes' and their floats the same but for a rare last bit. The GPU's lanes, combined in float, keep the two passes (their float-rounded s1 and s2
  // would carry that factor into the variance).
  DTRAIN_HD static double shifted_squares(double s1, double s2, double count) {
    const double squares = s2 - s1 * (s1 / count);
    return squares > 0.0 ? squares : 0.0;  // rounding of a (near-)constant channel
  }
  // Lane 0's writes from the channel's mean m and sum of squared deviations (also cpu::batchnorm_stats's).
  DTRAIN_HD void finish(int64_t c, double m, double squares) const {
    const double count = static_cast<double>(batch * plane);
    const float is = static_cast<float>(1.0 / sqrt(squares / count + static_cast<double>(eps)));
    const float mf = static_cast<float>(m);
    mean[c] = mf;
    invstd[c] = is;
    const float a = is * weight[c];
    alpha[c] = a;
    shift[c] = bias[c] - mf * a;
    if (low) {
      const double var = squares / count;
      const float vf = static_cast<float>(var);
      low[c] = static_cast<float>(m - static_cast<double>(mf));
      low[channels + c] = vf;
      low[2 * channels + c] = static_cast<float>(var - static_cast<double>(vf));
    }
    if (!running_mean) return;
    const double mo = momentum;
    const double unbiased = count > 1.0 ? squares / (count - 1.0) : squares / count;
    running_mean[c] = static_cast<float>(mo * m + (1.0 - mo) * running_mean[c]);
    running_var[c] = static_cast<float>(mo * unbiased + (1.0 - mo) * running_var[c]);
  }
};

// One channel c in evaluation: the running statistics folded into alpha[c] and shift[c].
struct BatchNormEvalCoefficients {
  float* alpha;
  float* shift;
  const float* running_mean;
  const float* running_var;
  const float* weight;
  const float* bias;
  float eps;
  DTRAIN_HD void operator()(int64_t c) const {
    const float is = static_cast<float>(1.0 / sqrt(static_cast<double>(running_var[c]) + static_cast<double>(eps)));
    const float a = is * weight[c];
    alpha[c] = a;
    shift[c] = bias[c] - running_mean[c] * a;
  }
};

// x * a + s, each operation rounded to float: nvcc would contract it into one FMA, and
// backward recomputes the fused ReLU's mask from it (Note [ReLU mask from the input]), so it
// must round the same way in both passes; on the CPU (ISO C++, no contraction) the same floats.
DTRAIN_HD inline float normalised(float x, float a, float s) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(__fmul_rn(x, a), s);
#else
  return x * a + s;
#endif
}

// Note [ReLU mask from the input]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A BatchNorm with a fused ReLU (Note [Fused ReLU] in model/module.h) outputs y = max(v, 0),
// v = normalised(x, alpha[c], shift[c]); backward masks dy where y <= 0, that is where !(v > 0)
// (a NaN v too). Backward has x (for x - mean) and alpha, shift (forward's, kept in BatchNorm's
// scratch), so it recomputes v instead of reading y: the same mask bitwise, and the two
// backward passes read two arrays (dy, x) instead of three (issue 24: a third of their memory
// traffic at the ResNet's bn1 layers). ReluMask names the coefficients (alpha nullptr: no ReLU).
struct ReluMask {
  const float* alpha = nullptr;  // [C]
  const float* shift = nullptr;  // [C]
  DTRAIN_HD bool on() const { return alpha != nullptr; }
  // Whether the ReLU let element x of channel c through.
  DTRAIN_HD bool keeps(float x, int64_t c) const { return normalised(x, alpha[c], shift[c]) > 0.f; }
};

// y = x * alpha[c] + shift[c], plus residual when given (ResNet's join: Note [Fused residual
// join] in model/resnet.cpp), then max(., 0) when relu (Note [Fused ReLU] in model/module.h),
// one (n, c) plane per thread: the CPU's path (no division per element, an inner loop the
// compiler vectorises). BatchNormApply computes the same floats one element per thread (the GPU's).
// The sum is AddRelu's (a float, then the ReLU), so the fused join gives the unfused bits.
struct BatchNormApplyPlanes {
  float* y;
  const float* x;
  const float* alpha;
  const float* shift;
  int64_t channels, plane;
  bool relu;
  const float* residual = nullptr;  // [N, C, plane] or nullptr
  DTRAIN_HD void operator()(int64_t r) const {
    const int64_t c = r % channels;
    const float a = alpha[c], s = shift[c];
    float* yr = y + r * plane;
    const float* xr = x + r * plane;
    if (residual) {
      const float* rr = residual + r * plane;
      if (relu) {
        for (int64_t p = 0; p < plane; ++p) {
          const float v = normalised(xr[p], a, s) + rr[p];
          yr[p] = v > 0.f ? v : 0.f;
        }
      } else {
        for (int64_t p = 0; p < plane; ++p) yr[p] = normalised(xr[p], a, s) + rr[p];
      }
    } else if (relu) {
      for (int64_t p = 0; p < plane; ++p) {
        const float v = normalised(xr[p], a, s);
        yr[p] = v > 0.f ? v : 0.f;
      }
    } else {
      for (int64_t p = 0; p < plane; ++p) yr[p] = normalised(xr[p], a, s);
    }
  }
};

struct BatchNormApply {
  BatchNormApplyPlanes a;
  DTRAIN_HD void operator()(int64_t i) const {
    const int64_t c = (i / a.plane) % a.channels;
    float v = normalised(a.x[i], a.alpha[c], a.shift[c]);
    if (a.residual) v = v + a.residual[i];
    a.y[i] = a.relu ? (v > 0.f ? v : 0.f) : v;
  }
};

// One channel c of backward (a row kernel): with dy' = dy (masked where the fused ReLU's output
// was 0: Note [ReLU mask from the input]),
// sum[c] = sum(dy'), dotp[c] = sum((x - mean) dy') (SyncBatchNorm all-reduces these two rows);
// the parameter gradients dweight = dotp * invstd and dbias = sum, written (grad_beta 0) or
// added (1), from this rank's sums (PyTorch's SyncBatchNorm too: DDP averages them).
struct BatchNormBackwardReduce {  // a row kernel over the channels
  float* grad_weight;  // [C]
  float* grad_bias;    // [C]
  float* sum_dy;       // [C]
  float* sum_dy_xmu;   // [C]: dotp
  const float* dy;     // [N, C, plane]
  ReluMask relu;       // the forward's fused ReLU, or none
  const float* x;
  const float* mean;
  const float* invstd;
  int64_t batch, channels, plane;
  float weight_beta, bias_beta;
  template <class Lanes>
  DTRAIN_HD void operator()(const Lanes& lanes, int64_t c) const {
    const double m = mean[c];
    auto g = [&](int64_t n, int64_t p) {
      const int64_t i = (n * channels + c) * plane + p;
      return static_cast<double>((relu.on() && !relu.keeps(x[i], c)) ? 0.f : dy[i]);
    };
    const double sum = channel_sum(lanes, batch, plane, g);
    const double dotp = channel_sum(lanes, batch, plane, [&](int64_t n, int64_t p) {
      return (static_cast<double>(x[(n * channels + c) * plane + p]) - m) * g(n, p);
    });
    if (lanes.lane() == 0) finish(c, sum, dotp);
  }
  // Lane 0's writes from the channel's two sums (also cpu::batchnorm_backward_reduce's).
  DTRAIN_HD void finish(int64_t c, double sum, double dotp) const {
    const float gw = static_cast<float>(dotp * static_cast<double>(invstd[c])), gb = static_cast<float>(sum);
    // Not beta * old: memory left stale by zero_grad may hold NaN (model/module.h).
    grad_weight[c] = weight_beta == 0.f ? gw : grad_weight[c] + gw;
    grad_bias[c] = bias_beta == 0.f ? gb : grad_bias[c] + gb;
    sum_dy[c] = static_cast<float>(sum);
    sum_dy_xmu[c] = static_cast<float>(dotp);
  }
};

// One channel c: the input gradient's coefficients from the sums over `count` values (this
// rank's, or with SyncBatchNorm every rank's, count[c] from BatchNormCombineStats; nullptr:
// local_count): dx = (dy' - grad_mean[c] - (x - mean) k[c]) * scale[c].
struct BatchNormBackwardCoefficients {
  float* grad_mean;  // [C]: sum_dy / n (may alias sum_dy)
  float* k;          // [C]: sum_dy_xmu * invstd^2 / n (may alias sum_dy_xmu)
  float* scale;      // [C]: invstd * weight
  const float* sum_dy;
  const float* sum_dy_xmu;
  const float* invstd;
  const float* weight;
  const float* count;  // [C] or nullptr
  double local_count;
  DTRAIN_HD void operator()(int64_t c) const {
    const double n = count ? static_cast<double>(count[c]) : local_count;
    const double is = invstd[c];
    const double s = sum_dy[c], d = sum_dy_xmu[c];
    grad_mean[c] = static_cast<float>(s / n);
    k[c] = static_cast<float>(d * is * is / n);
    scale[c] = static_cast<float>(is * weight[c]);
  }
};

// Note [SyncBatchNorm statistics]: PyTorch gathers each rank's mean and invstd as floats and
// recovers a rank's variance as 1/invstd^2 - eps, so the combined statistics carry float
// rounding of every rank's (a few 1e-8 relative), where BatchNorm at np 1 x NB rounds only the
// final mean and invstd. A BatchNorm bias's gradient is a channel's sum(dy) that nearly cancels
// (downstream BatchNorms remove any per-channel constant), so that rounding, spread through
// every normalised value, reached 1.2e-5 of the largest BatchNorm bias after one step
// (tests/mpi/ddp_test.cpp: resnet18 width 2, np 2 x 4 against np 1 x 8), over the 1e-5.
// Not DDP's float average of those cancelling sums: all-reducing the backward sums and taking
// the gradients from them in double (float + remainder) changed 1.21e-5 only to 1.13e-5. With
// each rank's double mean and variance gathered as a float and its float remainder, the step is
// 3.2e-6 from np 1 (logits 1.1e-6 -> 1.9e-7); np 3 x 4: 7.5e-6 -> 2.3e-6.
//
// SyncBatchNorm (PyTorch's batch_norm_gather_stats_with_counts): one channel c from every rank's
// [mean (C), invstd (C), mean remainder (C), biased variance (C), its remainder (C), count (1)]
// block of `gathered` (ranks with count 0 masked out; invstd is BatchNormStats's by-product, not
// read here): the mean over all values (each rank's float + remainder), the biased variance from
// each rank's and the spread of the means, then what BatchNormStats writes from them, and
// count[c] = the total (Note [SyncBatchNorm statistics]).
struct BatchNormCombineStats {
  float* mean;
  float* invstd;
  float* alpha;
  float* shift;
  float* count;
  float* running_mean;
  float* running_var;
  const float* gathered;  // [ranks, 5C + 1]
  const float* weight;
  const float* bias;
  int64_t ranks, channels;
  float eps, momentum;
  DTRAIN_HD void operator()(int64_t c) const {
    const int64_t stride = 5 * channels + 1;
    auto mean_of = [&](const float* g) { return static_cast<double>(g[c]) + static_cast<double>(g[2 * channels + c]); };
    double n = 0.0, sum = 0.0;
    for (int64_t r = 0; r < ranks; ++r) {
      const float* g = gathered + r * stride;
      const double nr = g[5 * channels];
      if (nr <= 0.0) continue;
      n += nr;
      sum += nr * mean_of(g);
    }
    const double m = n > 0.0 ? sum / n : 0.0;
    double squares = 0.0;  // n * (biased variance)
    for (int64_t r = 0; r < ranks; ++r) {
      const float* g = gathered + r * stride;
      const double nr = g[5 * channels];
      if (nr <= 0.0) continue;
      const double var = static_cast<double>(g[3 * channels + c]) + static_cast<double>(g[4 * channels + c]);
      const double d = mean_of(g) - m;
      squares += nr * (var + d * d);
    }
    const double var = n > 0.0 ? squares / n : 0.0;
    const float isf = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
    const float mf = static_cast<float>(m);
    mean[c] = mf;
    invstd[c] = isf;
    count[c] = static_cast<float>(n);
    const float a = isf * weight[c];
    alpha[c] = a;
    shift[c] = bias[c] - mf * a;
    const double mo = momentum;
    const double unbiased = n > 1.0 ? squares / (n - 1.0) : var;
    running_mean[c] = static_cast<float>(mo * m + (1.0 - mo) * running_mean[c]);
    running_var[c] = static_cast<float>(mo * unbiased + (1.0 - mo) * running_var[c]);
  }
};

struct SetValue {  // one thread: *out = value
  float* out;
  float value;
  DTRAIN_HD void operator()(int64_t) const { *out = value; }
};

// dx = (dy' - grad_mean[c] - (x - mean[c]) k[c]) * scale[c], one (n, c) plane per thread (the
// CPU's path); BatchNormBackwardInput the same floats one element per thread (the GPU's).
struct BatchNormBackwardInputPlanes {
  float* dx;
  const float* dy;
  ReluMask relu;  // the forward's fused ReLU, or none (Note [ReLU mask from the input])
  const float* x;
  const float* mean;
  const float* grad_mean;
  const float* k;
  const float* scale;
  int64_t channels, plane;
  DTRAIN_HD void operator()(int64_t r) const {
    const int64_t c = r % channels;
    const float m = mean[c], gm = grad_mean[c], kc = k[c], sc = scale[c];
    const int64_t base = r * plane;
    if (relu.on()) {
      const float a = relu.alpha[c], s = relu.shift[c];
      for (int64_t p = 0; p < plane; ++p) {
        // dy read whether or not masked: a conditional read became a slow masked load (vmaskmovps).
        const float xv = x[base + p], d = dy[base + p];
        const float g = normalised(xv, a, s) > 0.f ? d : 0.f;
        dx[base + p] = (g - gm - (xv - m) * kc) * sc;
      }
    } else {
      for (int64_t p = 0; p < plane; ++p)
        dx[base + p] = (dy[base + p] - gm - (x[base + p] - m) * kc) * sc;
    }
  }
};

struct BatchNormBackwardInput {
  BatchNormBackwardInputPlanes a;
  DTRAIN_HD void operator()(int64_t i) const {
    const int64_t c = (i / a.plane) % a.channels;
    const float g = (a.relu.on() && !a.relu.keeps(a.x[i], c)) ? 0.f : a.dy[i];
    a.dx[i] = (g - a.grad_mean[c] - (a.x[i] - a.mean[c]) * a.k[c]) * a.scale[c];
  }
};

struct IncrementCounter {  // one thread: *counter += 1 (num_batches_tracked)
  int64_t* counter;
  DTRAIN_HD void operator()(int64_t) const { *counter += 1; }
};

// ---- Global average pooling: [N, C, plane] -> [N, C] ----

struct GlobalAvgPoolForward {  // one (n, c) row
  float* y;
  const float* x;
  int64_t plane;
  DTRAIN_HD void operator()(int64_t r) const {
    const float* xr = x + r * plane;
    float s = 0.f;
    for (int64_t p = 0; p < plane; ++p) s += xr[p];
    y[r] = s / static_cast<float>(plane);
  }
};

struct GlobalAvgPoolBackward {  // dx[r, p] = dy[r] / plane
  float* dx;
  const float* dy;
  int64_t plane;
  DTRAIN_HD void operator()(int64_t i) const { dx[i] = dy[i / plane] / static_cast<float>(plane); }
};

// The same floats one (n, c) row per thread: the CPU's path (no division by plane per element).
struct GlobalAvgPoolBackwardPlanes {
  float* dx;
  const float* dy;
  int64_t plane;
  DTRAIN_HD void operator()(int64_t r) const {
    const float v = dy[r] / static_cast<float>(plane);
    for (int64_t p = 0; p < plane; ++p) dx[r * plane + p] = v;
  }
};

// ---- The residual join of a BasicBlock ----

struct AddRelu {  // y = max(a + b, 0)
  float* y;
  const float* a;
  const float* b;
  DTRAIN_HD void operator()(int64_t i) const {
    const float v = a[i] + b[i];
    y[i] = v > 0.f ? v : 0.f;
  }
};

// y = a + b where mask > 0, else 0: Add, then ReluBackward by the ReLU's output `mask`, in one
// pass (the same floats; Note [Chained joins] in model/resnet.cpp).
struct AddMasked {
  float* y;
  const float* a;
  const float* b;
  const float* mask;
  DTRAIN_HD void operator()(int64_t i) const {
    // The sum stored, then kept or zeroed: written as mask > 0 ? a + b : 0, GCC sinks the sum (a
    // float operation that may trap) into the branch and leaves the loop scalar with a branch.
    y[i] = a[i] + b[i];
    y[i] = mask[i] > 0.f ? y[i] : 0.f;
  }
};

struct Add {  // y = a + b
  float* y;
  const float* a;
  const float* b;
  DTRAIN_HD void operator()(int64_t i) const { y[i] = a[i] + b[i]; }
};

}  // namespace dtrain::kernels
