// CPU-shaped loops for BatchNorm's per-channel reductions (the CPU path of model/batchnorm.cpp).
// The row functors of model/norm_kernels.h stay the GPU path and the reference these are tested
// against (tests/unit/model/batchnorm_test.cpp): the same sums as their CPU lane (OneLane), in the
// same order, so the same bits. Run by a functor, each channel was a chain of scalar double
// additions with a branch per element (12% of a ResNet-18 step in issue 24's profile, the
// backward reduce reading dy, y and x twice); here each plane's four interleaved partial sums
// are one vector, and backward's two sums share one pass.
#pragma once

#include <string_view>

#include "model/norm_kernels.h"

namespace dtrain::cpu {

// kernels::BatchNormStats for channels [0, k.channels), bitwise (its OneLane arithmetic).
void batchnorm_stats(const kernels::BatchNormStats& k);

// kernels::BatchNormBackwardReduce for channels [0, k.channels), bitwise (its OneLane arithmetic):
// sum(dy') and sum((x - mean) dy') in one pass.
void batchnorm_backward_reduce(const kernels::BatchNormBackwardReduce& k);

// Which loops the two run on this CPU: "avx2" or "generic" (Note [BatchNorm reductions with AVX2]).
const char* norm_isa();

// Tests: run the loops named ("avx2", "generic"; "" = the best again) from now on; false when
// this CPU cannot.
bool select_norm_isa(std::string_view name);

}  // namespace dtrain::cpu
