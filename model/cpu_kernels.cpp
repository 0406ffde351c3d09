// The CPU loops of model/cpu_kernels.h.
#include "model/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/launch.h"
#include "model/attention_kernels.h"
#include "model/gpt_kernels.h"

namespace dtrain::cpu {

void broadcast_rows(const float* b, int64_t rows, int64_t cols, float* y) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(y + r * cols, b, sizeof(float) * static_cast<size_t>(cols));
}

DTRAIN_CPU_CLONES void relu_backward_bias(const float* dy, const float* relu_output, int64_t rows, int64_t cols,
                                          float* dz, float* db, float db_beta) {
  if (db && db_beta == 0.f) std::memset(db, 0, sizeof(float) * static_cast<size_t>(cols));  // stale memory may hold NaN
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict d = dy + r * cols;
    const float* __restrict z = d;
    if (relu_output) {
      const float* __restrict y = relu_output + r * cols;
      float* __restrict out = dz + r * cols;
      for (int64_t c = 0; c < cols; ++c) out[c] = y[c] > 0.f ? d[c] : 0.f;
      z = out;
    }
    if (db) {
      float* __restrict acc = db;
      for (int64_t c = 0; c < cols; ++c) acc[c] += z[c];
    }
  }
}

DTRAIN_CPU_CLONES void cross_entropy(const float* logits, const int32_t* labels, const float* class_weight,
                                     int64_t rows, int64_t classes, bool mean, float* grad, float* totals) {
  const auto valid = [&](int32_t y) { return y >= 0 && y < classes; };
  float weight_sum = 0.f;  // kernels::CrossEntropyTotal's sum of row weights, in its order
  for (int64_t r = 0; r < rows; ++r)
    weight_sum += valid(labels[r]) ? (class_weight ? class_weight[labels[r]] : 1.f) : 0.f;
  const float s = mean ? (weight_sum > 0.f ? 1.f / weight_sum : 0.f) : 1.f;
  float loss_sum = 0.f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits + r * classes;
    float* g = grad + r * classes;
    const int32_t y = labels[r];
    if (!valid(y)) {  // as the reference: NaN loss, zero gradient (times the scale)
      loss_sum += NAN;
      for (int64_t c = 0; c < classes; ++c) g[c] = 0.f * s;
      continue;
    }
    float m = z[0];
    for (int64_t c = 1; c < classes; ++c) m = z[c] > m ? z[c] : m;
    float sum = 0.f;
    for (int64_t c = 0; c < classes; ++c) sum += expf(z[c] - m);
    const float log_sum = logf(sum);
    const float w = class_weight ? class_weight[y] : 1.f;
    for (int64_t c = 0; c < classes; ++c) g[c] = (w * (expf(z[c] - m - log_sum) - (c == y ? 1.f : 0.f))) * s;
    loss_sum += w * (log_sum + m - z[y]);
  }
  totals[0] = loss_sum * s;
  totals[1] = s;
}

namespace {

// Note [Interleaved sums]: the sum over i < n of term(i) as 8 partial sums, lane j taking the
// i = j mod 8 in order, then added pairwise ((0+1)+(2+3))+((4+5)+(6+7)). A row's one chain of
// dependent adds (the functors' order on one CPU lane) waits an add's latency per element; the
// lanes vectorise. The same bits on every run and thread count; not the functors' bits.
constexpr int kSumLanes = 8;

template <class Term>
inline float interleaved_sum(int64_t n, const Term& term) {
  float lane[kSumLanes] = {};
  int64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes)
    for (int j = 0; j < kSumLanes; ++j) lane[j] += term(i + j);
  for (int j = 0; i + j < n; ++j) lane[j] += term(i + j);
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

}  // namespace

DTRAIN_CPU_CLONES void embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, int64_t positions,
                                         int64_t seq, int64_t cols, int64_t vocab, float* y) {
  for (int64_t p = 0; p < positions; ++p) {
    const int32_t tok = tokens[p];
    const float* __restrict pos = wpe + (p % seq) * cols;
    float* __restrict out = y + p * cols;
    if (tok >= 0 && tok < vocab) {
      const float* __restrict e = wte + static_cast<int64_t>(tok) * cols;
      for (int64_t c = 0; c < cols; ++c) out[c] = e[c] + pos[c];
    } else {
      for (int64_t c = 0; c < cols; ++c) out[c] = NAN + pos[c];
    }
  }
}

DTRAIN_CPU_CLONES void layernorm_forward(const float* x, const float* w, const float* b, int64_t rows, int64_t cols,
                                         float eps, float* y, float* mean, float* rstd) {
  const float n = static_cast<float>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict xr = x + r * cols;
    float* __restrict yr = y + r * cols;
    const float m = interleaved_sum(cols, [&](int64_t c) { return xr[c]; }) / n;
    const float v = interleaved_sum(cols, [&](int64_t c) {
      const float d = xr[c] - m;  // two passes, as the functor: the variance of (x - mean)
      return d * d;
    });
    const float rs = 1.f / sqrtf(v / n + eps);
    for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - m) * rs * w[c] + b[c];  // the functor's expression
    mean[r] = m;
    rstd[r] = rs;
  }
}

DTRAIN_CPU_CLONES void layernorm_backward(const float* dy, const float* x, const float* mean, const float* rstd,
                                          const float* w, const float* residual, int64_t rows, int64_t cols,
                                          float* partial, float* dx) {
  const int64_t chunks = (rows + kernels::kLayerNormChunk - 1) / kernels::kLayerNormChunk;
  const float n = static_cast<float>(cols);
  for (int64_t k = 0; k < chunks; ++k) {
    float* __restrict sw = partial + k * cols;             // the dw sums of chunk k
    float* __restrict sb = partial + (chunks + k) * cols;  // the db sums
    std::memset(sw, 0, sizeof(float) * static_cast<size_t>(cols));  // 0 + s is s: the functor's start
    std::memset(sb, 0, sizeof(float) * static_cast<size_t>(cols));
    const int64_t end = std::min(rows, (k + 1) * kernels::kLayerNormChunk);
    for (int64_t r = k * kernels::kLayerNormChunk; r < end; ++r) {
      const float* __restrict g = dy + r * cols;
      const float* __restrict xr = x + r * cols;
      const float m = mean[r], rs = rstd[r];
      for (int64_t c = 0; c < cols; ++c) {
        sw[c] += g[c] * (xr[c] - m) * rs;  // the functor's expression, in its order
        sb[c] += g[c];
      }
      if (!dx) continue;
      // kernels::LayerNormBackward's row with its two sums interleaved (Note [Interleaved sums])
      const float* __restrict wr = w;
      const float mg = interleaved_sum(cols, [&](int64_t c) { return g[c] * wr[c]; }) / n;
      const float mgx = interleaved_sum(cols, [&](int64_t c) { return g[c] * wr[c] * (xr[c] - m) * rs; }) / n;
      float* __restrict dxr = dx + r * cols;
      const float* __restrict res = residual ? residual + r * cols : nullptr;
      for (int64_t c = 0; c < cols; ++c) {
        const float d = rs * (g[c] * wr[c] - mg - (xr[c] - m) * rs * mgx);
        dxr[c] = res ? res[c] + d : d;
      }
    }
  }
}

// Note [CPU softmax]
// ~~~~~~~~~~~~~~~~~~
// kernels::CausalSoftmaxForward on one CPU lane calls libm's expf once per element (a call the
// loop cannot vectorise) and sums the exponentials in one chain of dependent adds: at issue 21's
// CPU shape that was about 3% of a training step. Here the exponentials come from arith_exp
// (Note [Arithmetic tanh], model/gpt_kernels.h), a vectorisable polynomial within a few float ulps
// of expf, and the sum from 8 interleaved partial sums (Note [Interleaved sums]). The max is the same
// float (max is exact); the probabilities differ from the functor's in their last bits (the test
// bounds them at 1e-6 relative), and are the same bits on every run and thread count. The GPU's
// functor is unchanged. e^v for v below -87 is taken as 0 (expf gives under 1.7e-38 there).
DTRAIN_CPU_CLONES void causal_softmax_forward(float* att, int64_t rows, int64_t time, int64_t block) {
  constexpr uint32_t kMinus87 = 0xc2ae0000u;  // -87.0f: arith_exp's lower end
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r % time, n = t + 1;  // the row's unmasked entries u <= t
    float* __restrict row = att + r * time;
    float lane_max[kSumLanes];
    for (float& l : lane_max) l = row[0];
    int64_t u = 0;
    for (; u + kSumLanes <= n; u += kSumLanes)
      for (int j = 0; j < kSumLanes; ++j) lane_max[j] = row[u + j] > lane_max[j] ? row[u + j] : lane_max[j];
    for (int j = 0; u + j < n; ++j) lane_max[j] = row[u + j] > lane_max[j] ? row[u + j] : lane_max[j];
    float m = lane_max[0];
    for (int j = 1; j < kSumLanes; ++j) m = lane_max[j] > m ? lane_max[j] : m;
    for (int64_t i = 0; i < n; ++i) {  // v = row - m <= 0 (or NaN, which stays NaN); e^v = 0 for v < -87
      const uint32_t bits = kernels::float_bits(row[i] - m);
      // -87 > v >= -inf: bits in (kMinus87, 0xff800000]; as an all-ones mask, and masks for the
      // clamp and the zero, not selects: the loop then vectorises.
      const uint32_t below = 0u - static_cast<uint32_t>(bits - (kMinus87 + 1u) <= 0xff800000u - (kMinus87 + 1u));
      const float e = kernels::arith_exp(kernels::bits_float(bits ^ ((bits ^ kMinus87) & below)));
      row[i] = kernels::bits_float(kernels::float_bits(e) & ~below);
    }
    const float sum = interleaved_sum(n, [&](int64_t i) { return row[i]; });
    const float inv = 1.f / sum;  // sum >= 1: the max's own term is exp(0)
    for (int64_t i = 0; i < n; ++i) row[i] *= inv;
    const int64_t end = kernels::causal_block_end(t, block, time);
    for (int64_t i = n; i < end; ++i) row[i] = 0.f;
  }
}

DTRAIN_CPU_CLONES void causal_softmax_backward(float* grad, const float* att, int64_t rows, int64_t time,
                                               int64_t block) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r % time, n = t + 1;
    float* __restrict g = grad + r * time;
    const float* __restrict p = att + r * time;
    const float dot = interleaved_sum(n, [&](int64_t u) { return p[u] * g[u]; });
    for (int64_t u = 0; u < n; ++u) g[u] = p[u] * (g[u] - dot);  // the functor's expression
    const int64_t end = kernels::causal_block_end(t, block, time);
    for (int64_t u = n; u < end; ++u) g[u] = 0.f;
  }
}

}  // namespace dtrain::cpu
