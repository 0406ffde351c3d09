// CUDA instantiations of the gradient-clipping kernels (model/grad_clip_kernels.h).
#include "core/cuda/launch.cuh"
#include "model/grad_clip_kernels.h"

DTRAIN_REGISTER_KERNEL(dtrain::kernels::SumSquaresStrided)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::SumSquaresSpans)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::SumGroups)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::GlobalNormAndClipCoefficient)
