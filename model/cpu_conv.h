// CPU-shaped loops for Conv2d and MaxPool2d (NCHW float32): the CPU path of model/conv.cpp.
// The device-generic functors in model/kernels.h stay the GPU path and the reference these loops
// are tested against (tests/unit/model/cpu_conv_test.cpp). Note [CPU convolution] in
// cpu_conv.cpp says why the loops are shaped as they are and what was measured against them.
#pragma once

#include <cstdint>

#include "model/kernels.h"

namespace dtrain::cpu {

// kernels::Im2col's batched column layout, the same values (a copy: bitwise).
void im2col(const float* x, const kernels::ConvGeometry& g, int64_t batch, float* col);

// kernels::Col2im as a scatter: each input pixel receives its taps in the order the reference
// adds them (ky, then kx, ascending), starting from zero, so the sums are bitwise equal.
// col is scratch: with stride 1 and the output the input's size (flat taps) the loop zeroes the
// elements of col that fall in the padding before adding each tap's run in one piece.
void col2im(float* col, const kernels::ConvGeometry& g, int64_t batch, float* dx);

// y[n, c, p] = yc[c, n*plane + p] + bias[c], then max(., 0) when relu: the GEMM's result to NCHW
// with the bias (and a following ReLU) in the same pass; bias nullptr: none. Bitwise kernels::ColumnsToNchwBias
// (then kernels::ReluForward).
void columns_to_nchw_bias(const float* yc, const float* bias, int64_t batch, int64_t channels, int64_t plane,
                          bool relu, float* y);

// The same for one image in place: y[c, p] += bias[c], then max(., 0) when relu (the GEMM wrote
// [channels, plane], which is one image's NCHW). Neither: nothing to do.
void bias_relu(float* y, const float* bias, int64_t channels, int64_t plane, bool relu);

// dyc[c, n*plane + p] = dy[n, c, p], zeroed where relu_output <= 0 when relu_output is given
// (the gradient through a fused ReLU); and the bias gradient db[c] = db_beta * db[c] + the sum of
// row c in the same pass (db_beta 0 overwrites, 1 accumulates; db nullptr: no bias). dyc is bitwise
// kernels::NchwToColumns (after kernels::ReluBackward); db is summed in 8 lanes per sample plane,
// planes in order: not the GEMM's order, equal within float rounding.
void nchw_to_columns(const float* dy, const float* relu_output, int64_t batch, int64_t channels, int64_t plane,
                     float* dyc, float* db, float db_beta);

// Sum of x[0, n) in 8 interleaved lanes (vectorises without reordering flags), lanes added last.
float lane_sum(const float* x, int64_t n);

// out[c, r] = t[r, c] for t [rows, cols] (beta 0), or out[c, r] + t[r, c] (beta 1; not beta *
// out: stale memory may hold NaN). Conv2d's weight gradient, computed transposed.
void transpose_into(const float* t, int64_t rows, int64_t cols, float* out, float beta);

// Bitwise kernels::MaxPoolForward over `planes` planes (n * channels; g.c is ignored).
void maxpool_forward(const float* x, const kernels::ConvGeometry& g, int64_t planes, float* y, int32_t* argmax);

// The scatter of the recorded argmax: dx = 0, then dx[argmax[o]] += dy[o]. Outputs are visited
// last to first, which gives each input the reference's order of windows (kernels::
// MaxPoolBackward gathers them by ky, kx ascending, i.e. oy, ox descending): bitwise equal, also
// for overlapping windows.
void maxpool_backward(const float* dy, const int32_t* argmax, const kernels::ConvGeometry& g, int64_t planes,
                      float* dx);

}  // namespace dtrain::cpu
