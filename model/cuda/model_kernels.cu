// CUDA instantiations of the model layer's device-generic kernels (model/kernels.h). The
// arithmetic is defined once in the functors; this file only asks nvcc to build the launches.
#include "core/cuda/launch.cuh"
#include "model/kernels.h"

namespace dtrain::kernels {
DTRAIN_INSTANTIATE_LAUNCH(BroadcastRows)
DTRAIN_INSTANTIATE_LAUNCH(ReluForward)
DTRAIN_INSTANTIATE_LAUNCH(ReluBackward)
DTRAIN_INSTANTIATE_LAUNCH(DropoutForward)
DTRAIN_INSTANTIATE_LAUNCH(Multiply)
DTRAIN_INSTANTIATE_LAUNCH(Im2col)
DTRAIN_INSTANTIATE_LAUNCH(Col2imAccumulate)
DTRAIN_INSTANTIATE_LAUNCH(ChannelBiasAdd)
DTRAIN_INSTANTIATE_LAUNCH(ChannelSumAccumulate)
DTRAIN_INSTANTIATE_LAUNCH(MaxPoolForward)
DTRAIN_INSTANTIATE_LAUNCH(MaxPoolBackward)
DTRAIN_INSTANTIATE_LAUNCH(CrossEntropyRows)
DTRAIN_INSTANTIATE_LAUNCH(CrossEntropyTotal)
DTRAIN_INSTANTIATE_LAUNCH(ScaleByDeviceScalar)
DTRAIN_INSTANTIATE_LAUNCH(ArgmaxEquals)
DTRAIN_INSTANTIATE_LAUNCH(SgdUpdate)
DTRAIN_INSTANTIATE_LAUNCH(AdamWUpdate)
}  // namespace dtrain::kernels
