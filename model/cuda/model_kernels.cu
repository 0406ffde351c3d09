// CUDA instantiations of the model layer's device-generic kernels (model/kernels.h). The
// arithmetic is defined once in the functors; this file only asks nvcc to build the launches.
#include "core/cuda/launch.cuh"
#include "model/kernels.h"

// Explicit instantiations belong at a scope enclosing the template: global, names qualified.
DTRAIN_INSTANTIATE_LAUNCH(dtrain::kernels::BroadcastRows)
DTRAIN_INSTANTIATE_LAUNCH(dtrain::kernels::ReluForward)
DTRAIN_INSTANTIATE_LAUNCH(dtrain::kernels::ReluBackward)
DTRAIN_INSTANTIATE_LAUNCH(dtrain::kernels::DropoutForward)
DTRAIN_INSTANTIATE_LAUNCH(dtrain::kernels::Multiply)
DTRAIN_INSTANTIATE_LAUNCH(dtrain::kernels::Im2col)
DTRAIN_INSTANTIATE_LAUNCH(dtrain::kernels::Col2im)
DTRAIN_INSTANTIATE_LAUNCH(dtrain::kernels::ColumnsToNchwBias)
DTRAIN_INSTANTIATE_LAUNCH(dtrain::kernels::NchwToColumns)
DTRAIN_INSTANTIATE_LAUNCH(dtrain::kernels::MaxPoolForward)
DTRAIN_INSTANTIATE_LAUNCH(dtrain::kernels::MaxPoolBackward)
DTRAIN_INSTANTIATE_LAUNCH(dtrain::kernels::CrossEntropyRows)
DTRAIN_INSTANTIATE_LAUNCH(dtrain::kernels::CrossEntropyTotal)
DTRAIN_INSTANTIATE_LAUNCH(dtrain::kernels::ScaleByDeviceScalar)
DTRAIN_INSTANTIATE_LAUNCH(dtrain::kernels::ArgmaxEquals)
DTRAIN_INSTANTIATE_LAUNCH(dtrain::kernels::SgdUpdate)
DTRAIN_INSTANTIATE_LAUNCH(dtrain::kernels::AdamWUpdate)
