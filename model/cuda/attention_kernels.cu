// CUDA instantiations of causal self-attention's device-generic kernels (model/attention_kernels.h).
#include "core/cuda/launch.cuh"
#include "model/attention_kernels.h"

DTRAIN_REGISTER_ROW_KERNEL(dtrain::kernels::RowsToHeads)
DTRAIN_REGISTER_ROW_KERNEL(dtrain::kernels::HeadsToRows)
DTRAIN_REGISTER_ROW_KERNEL(dtrain::kernels::CausalSoftmaxForward)
DTRAIN_REGISTER_ROW_KERNEL(dtrain::kernels::CausalSoftmaxBackward)
