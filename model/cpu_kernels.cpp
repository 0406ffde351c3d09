// The CPU loops of model/cpu_kernels.h.
#include "model/cpu_kernels.h"

#include <cmath>
#include <cstring>

#include "core/launch.h"

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

}  // namespace dtrain::cpu
