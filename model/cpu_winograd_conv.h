// Winograd 3x3 convolution on the CPU (NCHW float32, stride 1, padding 1, output the input's
// size): forward and input gradient by F(m x m, 3 x 3) with m = 2 or 4 (Note [Winograd CPU
// convolution] in cpu_winograd_conv.cpp). Conv2d's CPU float32 path takes these for the shapes
// winograd_tile picks; the weight gradient stays on the direct kernels (cpu_direct_conv.h).
#pragma once

#include <cstdint>
#include <string_view>

#include "model/kernels.h"

namespace dtrain::cpu {

struct WinogradConv {
  kernels::ConvGeometry g;  // g.c = in channels
  int64_t batch, out_c;
  int m;  // output tile: 2 or 4
};

// The tile Conv2d runs the layer with, 0 for none (the direct kernels): a fixed rule by shape,
// never a measurement at run time (the bits must not depend on the machine's load).
int winograd_tile(const kernels::ConvGeometry& g, int64_t out_c);

// 3x3, padding 1, stride 1, output the input's size.
bool winograd_fits(const kernels::ConvGeometry& g);

// Floats of scratch the two calls below need for d (forward's d, or the input gradient's, the
// same d: the input gradient is a convolution from out_c to g.c channels).
int64_t winograd_conv_scratch_floats(const WinogradConv& d);

// y [batch, out_c, h, w] = conv(x [batch, in_c, h, w], w [out_c, in_c, 3, 3]) + bias[co]
// (nullptr: none), then max(., 0) when relu.
void winograd_conv_forward(const WinogradConv& d, const float* x, const float* w, const float* bias, bool relu,
                           float* y, float* scratch);

// dx [batch, in_c, h, w] = the transposed convolution of dY' with w, dY' = dY [batch, out_c, h, w]
// zeroed where relu_output <= 0 (relu_output nullptr: dY' = dY).
void winograd_conv_input_grad(const WinogradConv& d, const float* w, const float* dy, const float* relu_output,
                              float* dx, float* scratch);

// Which instruction set the kernels run with on this CPU: "avx512", "avx2" or "generic".
const char* winograd_conv_isa();

// Tests: run the build named ("avx512", "avx2", "generic"; "" = the best again) from now on;
// false when this CPU cannot.
bool select_winograd_conv_isa(std::string_view name);

}  // namespace dtrain::cpu
