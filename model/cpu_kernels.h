// CPU-shaped loops for Linear and the loss (the CPU path of model/linear.cpp and model/loss.cpp).
// The device-generic functors in model/kernels.h stay the GPU path and the reference these are
// tested against (tests/unit/model/cpu_kernels_test.cpp).
#pragma once

#include <cstdint>

namespace dtrain::cpu {

// y[r, :] = b for r < rows: kernels::BroadcastRows as one copy per row (bitwise).
void broadcast_rows(const float* b, int64_t rows, int64_t cols, float* y);

// The backward pass in front of Linear's GEMMs, in one pass over dy [rows, cols]:
// - relu_output given (a fused ReLU): dz = dy where relu_output > 0, else 0 (bitwise
//   kernels::ReluBackward); without it dz is dy itself and `dz` is not written;
// - db given: db[c] = db_beta * db[c] + sum over rows of dz[:, c], rows added in order (db_beta
//   0 overwrites, 1 accumulates). The reference sums by a GEMM against ones: equal within
//   float rounding, not bitwise.
void relu_backward_bias(const float* dy, const float* relu_output, int64_t rows, int64_t cols, float* dz, float* db,
                        float db_beta);

// Softmax cross-entropy forward and its gradient in one pass over the logits [rows, classes],
// bitwise equal to kernels::CrossEntropyRows, CrossEntropyTotal and ScaleByDeviceScalar run in
// turn: the gradient scale (1 / the summed class weights of the labels, for the mean) depends
// only on the labels, so it is known before the pass. totals = {loss, scale}.
void cross_entropy(const float* logits, const int32_t* labels, const float* class_weight, int64_t rows,
                   int64_t classes, bool mean, float* grad, float* totals);

}  // namespace dtrain::cpu
