// CUDA instantiations of the model layer's device-generic kernels (model/kernels.h). The
// arithmetic is defined once in the functors; this file only asks nvcc to build the launches.
#include "core/cuda/launch.cuh"
#include "model/kernels.h"

// Registered at global scope with qualified names (see core/cuda/launch.cuh).
DTRAIN_REGISTER_KERNEL(dtrain::kernels::BroadcastRows)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::ReluForward)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::ReluBackward)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::DropoutForward)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::Multiply)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::Im2col)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::Col2im)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::ColumnsToNchwBias)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::NchwToColumns)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::MaxPoolForward)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::MaxPoolBackward)
DTRAIN_REGISTER_ROW_KERNEL(dtrain::kernels::CrossEntropyRows)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::CrossEntropyScale)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::CrossEntropyTotal)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::ScaleByDeviceScalar)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::ArgmaxEquals)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::SgdUpdate)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::AdamWUpdate)
