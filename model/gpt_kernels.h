// The GPT layers' kernels (LayerNorm, tanh-GELU, token + position embedding, residual add) as
// device-generic functors (core/launch.h); CUDA instantiations in model/cuda/gpt_kernels.cu.
// Every reduction is a loop in a fixed order inside one functor call, or a row kernel's lanes
// (Note [Row launches]; no atomics), so the results are the same bits on every thread count and
// on every run.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/kernels.h"
#include "core/launch.h"

namespace dtrain::kernels {

// y = beta == 0 ? s : y + s. A gradient marked absent (Parameter::grad_is_zero) holds stale
// memory, possibly NaN, so beta 0 must not read it (0 * NaN is NaN).
DTRAIN_HD inline float accumulate(float y, float s, float beta) { return beta == 0.f ? s : y + s; }

struct AccumulateInto {  // y = beta == 0 ? s : y + s (a gradient made in a scratch, Note [Padded logits])
  float* y;
  const float* s;
  float beta;
  DTRAIN_HD void operator()(int64_t i) const { y[i] = accumulate(y[i], s[i], beta); }
};

struct AddTensors {  // y = a + b (the residual connection)
  float* y;
  const float* a;
  const float* b;
  DTRAIN_HD void operator()(int64_t i) const { y[i] = a[i] + b[i]; }
};

// ---- LayerNorm over the last dimension: x is (rows, C) ----

struct LayerNormForward {  // per row r: y = (x - mean) * rstd * w + b; caches mean[r], rstd[r]
  float* y;
  float* mean;
  float* rstd;
  const float* x;
  const float* w;
  const float* b;
  int64_t cols;
  float eps;
  template <class Lanes>  // a row kernel: Note [Row launches] (core/launch.h)
  DTRAIN_HD void operator()(const Lanes& lanes, int64_t r) const {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    float s = 0.f;
    for (int64_t c = lanes.lane(); c < cols; c += lanes.count()) s += xr[c];
    const float m = lanes.sum(s) / static_cast<float>(cols);
    float v = 0.f;  // two passes: the variance of (x - mean), not E[x^2] - mean^2
    for (int64_t c = lanes.lane(); c < cols; c += lanes.count()) {
      const float d = xr[c] - m;
      v += d * d;
    }
    const float rs = 1.f / sqrtf(lanes.sum(v) / static_cast<float>(cols) + eps);
    for (int64_t c = lanes.lane(); c < cols; c += lanes.count()) yr[c] = (xr[c] - m) * rs * w[c] + b[c];
    if (lanes.lane() == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
  }
};

// Per row r, with xhat = (x - mean) * rstd and g = dy * w:
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) [+ residual: the gradient that reaches x
// around the block, added here instead of in a pass of its own].
struct LayerNormBackward {
  float* dx;
  const float* dy;
  const float* x;
  const float* mean;
  const float* rstd;
  const float* w;
  const float* residual;  // (rows, C) or nullptr
  int64_t cols;
  template <class Lanes>  // a row kernel: Note [Row launches] (core/launch.h)
  DTRAIN_HD void operator()(const Lanes& lanes, int64_t r) const {
    const float* xr = x + r * cols;
    const float* dyr = dy + r * cols;
    float* dxr = dx + r * cols;
    const float m = mean[r], rs = rstd[r];
    float sg = 0.f, sgx = 0.f;
    for (int64_t c = lanes.lane(); c < cols; c += lanes.count()) {
      const float g = dyr[c] * w[c];
      sg += g;
      sgx += g * (xr[c] - m) * rs;
    }
    const float n = static_cast<float>(cols);
    const float mg = lanes.sum(sg) / n, mgx = lanes.sum(sgx) / n;
    for (int64_t c = lanes.lane(); c < cols; c += lanes.count()) {
      const float d = rs * (dyr[c] * w[c] - mg - (xr[c] - m) * rs * mgx);
      dxr[c] = residual ? residual[r * cols + c] + d : d;
    }
  }
};

// Note [LayerNorm parameter gradient]: dw[c] = sum_r dy[r,c] xhat[r,c] and db[c] = sum_r dy[r,c]
// in two fixed-order stages: partial sums over chunks of kLayerNormChunk rows (one call per
// (chunk, column)), then the chunks in order per column. One call per column alone would give
// a GPU C threads (768 for GPT-2) each walking every row; the chunks give it rows/256 x C. The
// chunk size is a constant, not a device property, so the CPU and the GPU sum in the same order
// and every thread count gives the same bits.
inline constexpr int64_t kLayerNormChunk = 256;

struct LayerNormParamPartial {  // per (chunk k, column c): partial[k, c] and partial[chunks + k, c]
  float* partial;               // (2, chunks, C): the dw sums, then the db sums
  const float* dy;
  const float* x;
  const float* mean;
  const float* rstd;
  int64_t rows, cols, chunks;
  DTRAIN_HD void operator()(int64_t i) const {
    const int64_t k = i / cols, c = i % cols;
    const int64_t end = (k + 1) * kLayerNormChunk < rows ? (k + 1) * kLayerNormChunk : rows;
    float sw = 0.f, sb = 0.f;
    for (int64_t r = k * kLayerNormChunk; r < end; ++r) {
      const float g = dy[r * cols + c];
      sw += g * (x[r * cols + c] - mean[r]) * rstd[r];
      sb += g;
    }
    partial[i] = sw;
    partial[chunks * cols + i] = sb;
  }
};

struct LayerNormParamGrad {  // per column c: dw[c] (+)= sum_k partial[k, c], db[c] likewise
  float* dw;
  float* db;
  const float* partial;
  int64_t cols, chunks;
  float beta_w, beta_b;
  DTRAIN_HD void operator()(int64_t c) const {
    float sw = 0.f, sb = 0.f;
    for (int64_t k = 0; k < chunks; ++k) {
      sw += partial[k * cols + c];
      sb += partial[(chunks + k) * cols + c];
    }
    dw[c] = accumulate(dw[c], sw, beta_w);
    db[c] = accumulate(db[c], sb, beta_b);
  }
};

// ---- GELU, tanh approximation (PyTorch's approximate="tanh") ----

inline constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float kGeluCubic = 0.044715f;

// Note [Arithmetic tanh]: libm's tanhf is one scalar call per element (the CPU loop cannot
// vectorise it without fast-math), ~15 ns, and GELU runs it on every element of the 4C-wide MLP
// activation twice per step. GELU only needs tanh to an absolute error of a few float ulps of 1
// (it adds tanh to 1), so tanh(u) = 1 - 2 / (1 + e^(2u)) with an exp of plain arithmetic:
// e^v = 2^n e^r, n = round(v / ln 2), |r| <= ln 2 / 2, e^r by its degree-7 Taylor polynomial
// (truncation < 5e-9 relative), 2^n built in the exponent bits. It vectorises on the CPU, runs
// as is on the GPU, and stays within 3e-7 of tanh (gpt_layers_test.cpp checks it on a grid).
DTRAIN_HD inline float arith_exp(float v) {  // v in [-87, 87]
  constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693145751953125f, kLn2Lo = 1.42860682030941723e-6f;
  constexpr float kRound = 12582912.f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  const float n = (v * kLog2e + kRound) - kRound;
  const float r = (v - n * kLn2Hi) - n * kLn2Lo;
  const float p =
      1.f + r * (1.f + r * (0.5f + r * (1.f / 6 + r * (1.f / 24 + r * (1.f / 120 + r * (1.f / 720 + r * (1.f / 5040)))))));
  return p * bits_float(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
}

DTRAIN_HD inline float arith_tanh(float u) {
  // tanh(|u|) with |u| capped at 10 (where 1 - 2/(1 + e^20) rounds to 1), then u's sign. The
  // cap is an integer select on the bits (non-negative floats order as their bits): a float
  // select blocks the CPU loop's vectoriser (it may trap); NaN caps to 10 (GELU's x * ... stays NaN).
  const uint32_t bits = float_bits(u);
  uint32_t mag = bits & 0x7fffffffu;
  mag = mag > 0x41200000u ? 0x41200000u : mag;  // 10.0f
  const float t = 1.f - 2.f / (1.f + arith_exp(2.f * bits_float(mag)));
  return bits_float(float_bits(t) | (bits & 0x80000000u));
}

struct GeluForward {  // y = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  float* y;
  const float* x;
  DTRAIN_HD void operator()(int64_t i) const {
    const float v = x[i];
    y[i] = 0.5f * v * (1.f + arith_tanh(kGeluScale * (v + kGeluCubic * v * v * v)));
  }
};

struct GeluBackward {  // dx = dy * (1/2 (1 + t) + x/2 (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2))
  float* dx;
  const float* dy;
  const float* x;
  DTRAIN_HD void operator()(int64_t i) const {
    const float v = x[i];
    const float t = arith_tanh(kGeluScale * (v + kGeluCubic * v * v * v));
    const float d = 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * kGeluScale * (1.f + 3.f * kGeluCubic * v * v);
    dx[i] = dy[i] * d;
  }
};

// ---- Token + position embedding: tokens (B, T) int32, wte (V, C), wpe (context, C) ----

struct EmbeddingForward {  // y[b, t, c] = wte[tokens[b, t], c] + wpe[t, c]; a token outside [0, V) gives NaN
  float* y;
  const int32_t* tokens;
  const float* wte;
  const float* wpe;
  int64_t seq, cols, vocab;  // seq = T of this batch (<= context)
  DTRAIN_HD void operator()(int64_t i) const {
    const int64_t p = i / cols, c = i % cols;
    const int32_t tok = tokens[p];
    const float e = (tok >= 0 && tok < vocab) ? wte[static_cast<int64_t>(tok) * cols + c] : NAN;
    y[i] = e + wpe[(p % seq) * cols + c];
  }
};

// Note [Token buckets]
// ~~~~~~~~~~~~~~~~~~~~
// The backward of the token embedding gathers each vocabulary row's gradient from the positions
// holding that token, in position order (EmbeddingBackward). Those positions come from sorting
// the positions by the key (token, position): keys are unique, so the sorted order is one and
// the same however it is computed; that is a stable sort by token. A serial counting sort on
// one device thread was the bottleneck on a GPU (B*T + V serial steps). Instead: a merge sort
// in ceil(log2(B*T)) rounds of B*T threads (MergeByToken: each element finds its place in the
// partner run by binary search), then V + 1 threads find where each token's positions begin
// (TokenOffsets). Tokens outside [0, V) sort last as if they were V and belong to no row.
// Measured on the CPU, 1 thread, machine load 10 (no GPU here): the whole embedding backward at
// B*T = 8192, V = 50257, C = 64 took 34-37 ms against 22-24 ms with the serial sort; at GPT-2's
// sizes a CPU step takes seconds, so the CPU pays that for one code path tested everywhere.
// On a GPU it is unmeasured.

// The sort key's token: out-of-range tokens count as `vocab`, after every real one.
DTRAIN_HD inline int64_t bucket_token(const int32_t* tokens, int32_t p, int64_t vocab) {
  const int32_t t = tokens[p];
  return t >= 0 && t < vocab ? t : vocab;
}

// One round of the merge sort, per element i of src (n = positions): src holds sorted runs of
// `width` positions; run pairs (2k, 2k + 1) merge into dst. Element i's place is its index in
// its run plus the partner run's count of smaller keys (token, position).
struct MergeByToken {
  int32_t* dst;
  const int32_t* src;
  const int32_t* tokens;
  int64_t positions, width, vocab;
  DTRAIN_HD void operator()(int64_t i) const {
    const int64_t run = i / width, start = run * width, pair_start = (run / 2) * 2 * width;
    const int64_t other = (run % 2 == 0) ? start + width : start - width;
    int64_t lo = other < positions ? other : positions;
    int64_t hi = other + width < positions ? other + width : positions;
    const int32_t p = src[i];
    const int64_t tok = bucket_token(tokens, p, vocab);
    const int64_t first = lo;
    while (lo < hi) {  // the first partner element whose key is above (tok, p)
      const int64_t mid = lo + (hi - lo) / 2;
      const int32_t q = src[mid];
      const int64_t tq = bucket_token(tokens, q, vocab);
      if (tq < tok || (tq == tok && q < p))
        lo = mid + 1;
      else
        hi = mid;
    }
    dst[pair_start + (i - start) + (lo - first)] = p;
  }
};

// Per v in [0, vocab]: offsets[v] = how many of the sorted positions hold a token below v, so
// row v's positions are order[offsets[v] .. offsets[v + 1]) (binary search over order).
struct TokenOffsets {
  int32_t* offsets;  // [vocab + 1]
  const int32_t* order;  // [positions], sorted by (token, position)
  const int32_t* tokens;
  int64_t positions, vocab;
  DTRAIN_HD void operator()(int64_t v) const {
    int64_t lo = 0, hi = positions;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (bucket_token(tokens, order[mid], vocab) < v)
        lo = mid + 1;
      else
        hi = mid;
    }
    offsets[v] = static_cast<int32_t>(lo);
  }
};

struct IotaI32 {  // y[i] = i
  int32_t* y;
  DTRAIN_HD void operator()(int64_t i) const { y[i] = static_cast<int32_t>(i); }
};

// Per (v, c): dwte[v, c] (+)= sum of dy[p, c] over the positions p holding token v, in
// position order (a gather through the token buckets, Note [Token buckets]: no atomics, the
// same bits on any thread count).
struct EmbeddingBackward {
  float* dwte;
  const float* dy;
  const int32_t* offsets;
  const int32_t* order;
  int64_t cols;
  float beta;
  DTRAIN_HD void operator()(int64_t i) const {
    const int64_t v = i / cols, c = i % cols;
    float s = 0.f;
    for (int32_t j = offsets[v]; j < offsets[v + 1]; ++j) s += dy[static_cast<int64_t>(order[j]) * cols + c];
    dwte[i] = accumulate(dwte[i], s, beta);
  }
};

// Per (t, c) of wpe (context rows): dwpe[t, c] (+)= sum_b dy[b, t, c]; rows t >= seq get 0.
struct PositionBackward {
  float* dwpe;
  const float* dy;
  int64_t batch, seq, cols;
  float beta;
  DTRAIN_HD void operator()(int64_t i) const {
    const int64_t t = i / cols, c = i % cols;
    float s = 0.f;
    if (t < seq)
      for (int64_t b = 0; b < batch; ++b) s += dy[(b * seq + t) * cols + c];
    dwpe[i] = accumulate(dwpe[i], s, beta);
  }
};

}  // namespace dtrain::kernels
