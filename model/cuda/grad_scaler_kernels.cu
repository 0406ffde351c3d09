// CUDA instantiations of the loss-scaling kernels (model/grad_scaler_kernels.h).
#include "core/cuda/launch.cuh"
#include "model/grad_scaler_kernels.h"

DTRAIN_REGISTER_KERNEL(dtrain::kernels::UnscaleCheckStrided)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::SumToOne)
