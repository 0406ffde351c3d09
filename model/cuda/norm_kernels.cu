// CUDA instantiations of the BatchNorm, pooling and residual kernels (model/norm_kernels.h).
#include "core/cuda/launch.cuh"
#include "model/norm_kernels.h"

DTRAIN_REGISTER_ROW_KERNEL(dtrain::kernels::BatchNormStats)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::BatchNormEvalCoefficients)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::BatchNormApply)
DTRAIN_REGISTER_ROW_KERNEL(dtrain::kernels::BatchNormBackwardReduce)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::BatchNormBackwardInput)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::IncrementCounter)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::GlobalAvgPoolForward)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::GlobalAvgPoolBackward)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::GlobalAvgPoolBackwardPlanes)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::AddRelu)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::Add)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::AddMasked)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::BatchNormBackwardCoefficients)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::BatchNormCombineStats)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::SetValue)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::BatchNormApplyPlanes)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::BatchNormBackwardInputPlanes)
