// Generic elementwise kernels as device-generic functors (run through launch()), and the
// bf16/fp16 conversions used by the compressed-gradient communication hooks.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/launch.h"

namespace dtrain::kernels {

struct Fill {
  float* y;
  float value;
  DTRAIN_HD void operator()(int64_t i) const { y[i] = value; }
};

struct Scale {  // y *= alpha
  float* y;
  float alpha;
  DTRAIN_HD void operator()(int64_t i) const { y[i] *= alpha; }
};

struct Axpy {  // y += alpha * x
  float* y;
  const float* x;
  float alpha;
  DTRAIN_HD void operator()(int64_t i) const { y[i] += alpha * x[i]; }
};

// ---- 16-bit floats, round to nearest even; NaN stays NaN, overflow goes to infinity ----

DTRAIN_HD inline uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

DTRAIN_HD inline float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

DTRAIN_HD inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

DTRAIN_HD inline float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

DTRAIN_HD inline uint16_t float_to_fp16(float f) {
  uint32_t x = float_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) return static_cast<uint16_t>(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (a < 0x38800000u) {                                                // below 2^-14: subnormal
    if (a < 0x33000000u) return static_cast<uint16_t>(sign);           // below 2^-25: zero
    uint32_t e = a >> 23;
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e;
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t h = (a - 0x38000000u) >> 13;  // rebias the exponent from 127 to 15
  uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

DTRAIN_HD inline float fp16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24
    return sign ? -v : v;
  }
  if (e == 31) return bits_float(sign | 0x7f800000u | (m << 13));
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

// Packs float32 into 16-bit words, optionally pre-scaled (averaging folded into the cast).
struct PackBF16 {
  uint16_t* y;
  const float* x;
  float scale;
  DTRAIN_HD void operator()(int64_t i) const { y[i] = float_to_bf16(x[i] * scale); }
};
struct UnpackBF16 {
  float* y;
  const uint16_t* x;
  DTRAIN_HD void operator()(int64_t i) const { y[i] = bf16_to_float(x[i]); }
};
struct PackFP16 {
  uint16_t* y;
  const float* x;
  float scale;
  DTRAIN_HD void operator()(int64_t i) const { y[i] = float_to_fp16(x[i] * scale); }
};
struct UnpackFP16 {
  float* y;
  const uint16_t* x;
  DTRAIN_HD void operator()(int64_t i) const { y[i] = fp16_to_float(x[i]); }
};

// Row r of a [rows, cols] matrix between two row strides: dst[r*dst_ld + c] = src[r*src_ld + c],
// and dst's columns from cols to dst_ld (a padded layout's pad) zero. A row kernel (Note [Row
// launches], core/launch.h): a warp copies a row, coalesced.
struct CopyRows {
  float* dst;
  const float* src;
  int64_t cols, dst_ld, src_ld;
  template <class Lanes>
  DTRAIN_HD void operator()(const Lanes& lanes, int64_t r) const {
    for (int64_t c = lanes.lane(); c < cols; c += lanes.count()) dst[r * dst_ld + c] = src[r * src_ld + c];
    for (int64_t c = cols + lanes.lane(); c < dst_ld; c += lanes.count()) dst[r * dst_ld + c] = 0.f;
  }
};

// PackBF16 / PackFP16 (scale 1) of a [rows, cols] matrix into rows of stride dst_ld, the columns
// from cols to dst_ld zero. A row kernel.
struct PackRowsHalf {
  uint16_t* dst;
  const float* src;
  int64_t cols, dst_ld;
  bool fp16;
  template <class Lanes>
  DTRAIN_HD void operator()(const Lanes& lanes, int64_t r) const {
    for (int64_t c = lanes.lane(); c < cols; c += lanes.count()) {
      const float v = src[r * cols + c];
      dst[r * dst_ld + c] = fp16 ? float_to_fp16(v) : float_to_bf16(v);
    }
    for (int64_t c = cols + lanes.lane(); c < dst_ld; c += lanes.count()) dst[r * dst_ld + c] = 0;
  }
};

}  // namespace dtrain::kernels
