// Causal self-attention's kernels (model/attention.cpp) as device-generic functors (core/launch.h),
// instantiated for CUDA in model/cuda/attention_kernels.cu. B sequences of T tokens, H heads of
// hs = C / H features. "Heads" tensors are (parts, B*H, T, hs): each head's T x hs matrix is
// contiguous, as the per-head GEMMs want it; "rows" tensors are (B*T, parts*C) as Linear gives them
// (parts = 3 for c_attn's q|k|v, 1 for the attention output).
//
// Note [Causal blocks]: the scores att = q k^T are computed in blocks of `block` query rows, block
// i only against keys [0, end of block i): the keys after the block are masked for every row of it.
// That is about half the products' work for T >> block (T = 256, block 64: 5/8 of the full
// square). Every later product reads only that lower block triangle, so the softmax kernels also
// zero the masked entries inside the diagonal block (u > t, u < end of t's block), which those
// products do read; entries right of the block are never written nor read.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/launch.h"

namespace dtrain::kernels {

// The offset in a rows tensor (B*T, parts*C) of segment i = ((s*B + b)*H + h)*T + t of a heads
// tensor (parts, B*H, T, hs): rows[b*T + t, s*C + h*hs]. Both re-layouts below walk it.
DTRAIN_HD inline int64_t head_row_offset(int64_t i, int64_t batch, int64_t time, int64_t heads_n, int64_t head_size,
                                         int64_t parts) {
  const int64_t t = i % time, bh = i / time, h = bh % heads_n, sb = bh / heads_n, b = sb % batch, s = sb / batch;
  const int64_t c = heads_n * head_size;
  return (b * time + t) * parts * c + s * c + h * head_size;
}

// One (part, b, h, t) segment of hs floats per i: heads[s, b*H + h, t, :] = rows[b*T + t, s*C + h*hs : +hs].
// n = parts*B*H*T. A segment per i, not an element: the index arithmetic is paid once per hs floats.
struct RowsToHeads {
  float* heads;
  const float* rows;
  int64_t batch, time, heads_n, head_size, parts;
  template <class Lanes>  // a row kernel (Note [Row launches]): the lanes copy a segment
  DTRAIN_HD void operator()(const Lanes& lanes, int64_t i) const {
    const float* src = rows + head_row_offset(i, batch, time, heads_n, head_size, parts);
    float* dst = heads + i * head_size;
    for (int64_t d = lanes.lane(); d < head_size; d += lanes.count()) dst[d] = src[d];
  }
};

// The inverse: rows[b*T + t, s*C + h*hs : +hs] = heads[s, b*H + h, t, :]; n = parts*B*H*T.
struct HeadsToRows {
  float* rows;
  const float* heads;
  int64_t batch, time, heads_n, head_size, parts;
  template <class Lanes>  // a row kernel (Note [Row launches]): the lanes copy a segment
  DTRAIN_HD void operator()(const Lanes& lanes, int64_t i) const {
    float* dst = rows + head_row_offset(i, batch, time, heads_n, head_size, parts);
    const float* src = heads + i * head_size;
    for (int64_t d = lanes.lane(); d < head_size; d += lanes.count()) dst[d] = src[d];
  }
};

// The end (exclusive) of the causal block holding row t (Note [Causal blocks]).
DTRAIN_HD inline int64_t causal_block_end(int64_t t, int64_t block, int64_t time) {
  const int64_t end = (t / block + 1) * block;
  return end < time ? end : time;
}

// One row r = (b*H + h)*T + t of att (B*H, T, T) per i, in place: att[r, u] = softmax over u <= t
// of the scaled scores, max-subtracted (stable for any score); 0 for t < u < end of t's block.
struct CausalSoftmaxForward {
  float* att;
  int64_t time, block;
  template <class Lanes>  // a row kernel: Note [Row launches] (core/launch.h)
  DTRAIN_HD void operator()(const Lanes& lanes, int64_t r) const {
    const int64_t t = r % time;
    float* row = att + r * time;
    float m = row[0];
    for (int64_t u = 1 + lanes.lane(); u <= t; u += lanes.count()) m = row[u] > m ? row[u] : m;
    m = lanes.max(m);
    float sum = 0.f;
    for (int64_t u = lanes.lane(); u <= t; u += lanes.count()) {
      const float e = expf(row[u] - m);
      row[u] = e;
      sum += e;
    }
    const float inv = 1.f / lanes.sum(sum);  // sum >= 1: the max's own term is exp(0)
    for (int64_t u = lanes.lane(); u <= t; u += lanes.count()) row[u] *= inv;
    const int64_t end = causal_block_end(t, block, time);
    for (int64_t u = t + 1 + lanes.lane(); u < end; u += lanes.count()) row[u] = 0.f;
  }
};

// Softmax backward per row, in place over the incoming gradient: with p = att[r, :] and
// g = grad[r, :] (dL/dp), grad[r, u] = p[u] * (g[u] - sum over u' <= t of p[u'] g[u']) for u <= t,
// i.e. dL/dscore; 0 for t < u < end of t's block (the masked scores get no gradient).
struct CausalSoftmaxBackward {
  float* grad;
  const float* att;
  int64_t time, block;
  template <class Lanes>  // a row kernel: Note [Row launches] (core/launch.h)
  DTRAIN_HD void operator()(const Lanes& lanes, int64_t r) const {
    const int64_t t = r % time;
    float* g = grad + r * time;
    const float* p = att + r * time;
    float dot = 0.f;
    for (int64_t u = lanes.lane(); u <= t; u += lanes.count()) dot += p[u] * g[u];
    dot = lanes.sum(dot);
    for (int64_t u = lanes.lane(); u <= t; u += lanes.count()) g[u] = p[u] * (g[u] - dot);
    const int64_t end = causal_block_end(t, block, time);
    for (int64_t u = t + 1 + lanes.lane(); u < end; u += lanes.count()) g[u] = 0.f;
  }
};

}  // namespace dtrain::kernels
