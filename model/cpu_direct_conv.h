// Direct 3x3 convolution on the CPU (NCHW float32, stride 1 or 2, padding 1): forward, input gradient
// and weight gradient without im2col columns (Note [Direct CPU convolution] in
// cpu_direct_conv.cpp). Conv2d's CPU float32 path takes these for the shapes direct_conv_fits
// accepts and the chunked im2col + GEMM path (Note [Chunked CPU convolution]) for the rest.
#pragma once

#include <cstdint>
#include <string_view>

#include "model/kernels.h"

namespace dtrain::cpu {

struct DirectConv {
  kernels::ConvGeometry g;  // g.c = in channels
  int64_t batch, out_c;
};

// 3x3, padding 1, stride 1 or 2, with outputs at least kDirectConvMinWidth wide (narrower, the
// zero column of each row would waste a third or more of every vector).
constexpr int64_t kDirectConvMinWidth = 4;
bool direct_conv_fits(const kernels::ConvGeometry& g);

// Floats of scratch the two calls below need for d (a chunk of images at a time).
int64_t direct_conv_scratch_floats(const DirectConv& d);

// y [batch, out_c, oh, ow] = conv(x [batch, in_c, h, w], w [out_c, in_c, 3, 3]) + bias[co]
// (nullptr: none), then max(., 0) when relu.
void direct_conv_forward(const DirectConv& d, const float* x, const float* w, const float* bias, bool relu, float* y,
                         float* scratch);

// With dY' = dY zeroed where relu_output <= 0 (relu_output nullptr: dY' = dY):
// dw [out_c, in_c, 3, 3] = dw_beta * dw + sum_n dY' (*) x   (beta 0 overwrites, 1 accumulates),
// db [out_c] likewise with the sums of dY' (db nullptr: no bias),
// dx [batch, in_c, h, w] = the transposed convolution of dY' with w (dx nullptr: not wanted).
void direct_conv_backward(const DirectConv& d, const float* x, const float* w, const float* dy,
                          const float* relu_output, float* dx, float* dw, float dw_beta, float* db, float db_beta,
                          float* scratch);

// Which instruction set the kernels run with on this CPU: "avx512", "avx2" or "generic".
const char* direct_conv_isa();

// Tests: run the build named ("avx512", "avx2", "generic"; "" = the best again) from now on;
// false when this CPU cannot.
bool select_direct_conv_isa(std::string_view name);

}  // namespace dtrain::cpu
