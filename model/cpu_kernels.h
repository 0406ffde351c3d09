// CPU-shaped loops for Linear, the loss, LayerNorm's backward and attention's softmax (the CPU
// paths of model/linear.cpp, model/loss.cpp, model/layernorm.cpp and model/attention.cpp).
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

// kernels::EmbeddingForward row by row (bitwise): y[p, :] = wte[tokens[p], :] + wpe[p % seq, :], NaN
// for a token outside [0, vocab); the functor pays a division and a remainder per element.
void embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, int64_t positions, int64_t seq,
                       int64_t cols, int64_t vocab, float* y);

// kernels::LayerNormForward's rows with its two sums (mean, variance) interleaved (Note
// [Interleaved sums], model/cpu_kernels.cpp): within float rounding of the functor, not its bits.
void layernorm_forward(const float* x, const float* w, const float* b, int64_t rows, int64_t cols, float eps, float* y,
                       float* mean, float* rstd);

// kernels::LayerNormParamPartial and, with dx given, kernels::LayerNormBackward in one pass over
// the rows. The parameter sums bitwise: each chunk of kernels::kLayerNormChunk rows adds its rows
// into the chunk's column sums in row order, as the functor's per-column loop does, while the rows
// are in cache for dx (the functor walks each column down the rows, a cache line per element, in
// a pass of its own). dx with its row's two sums interleaved (Note [Interleaved sums]): within
// float rounding of the functor, not its bits.
// x, dy, residual, dx (rows, cols); partial (2, chunks, cols) as the functor writes it.
void layernorm_backward(const float* dy, const float* x, const float* mean, const float* rstd, const float* w,
                        const float* residual, int64_t rows, int64_t cols, float* partial, float* dx);

// kernels::CausalSoftmaxForward over rows [0, rows) of att (rows, time), row r being query
// t = r % time, in place; Note [CPU softmax] (model/cpu_kernels.cpp) says how its floats differ.
void causal_softmax_forward(float* att, int64_t rows, int64_t time, int64_t block);
// kernels::CausalSoftmaxBackward likewise (grad in place, att the probabilities), its dot product
// p . g interleaved (Note [Interleaved sums]): within float rounding of the functor.
void causal_softmax_backward(float* grad, const float* att, int64_t rows, int64_t time, int64_t block);

}  // namespace dtrain::cpu
