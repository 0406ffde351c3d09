// GPU instantiations of launch() for the elementwise functors of core/kernels.h. A functor
// added there needs a line here, or the CUDA build fails to link.
#include "core/cuda/launch.cuh"
#include "core/kernels.h"

DTRAIN_INSTANTIATE_LAUNCH(dtrain::kernels::Fill)
DTRAIN_INSTANTIATE_LAUNCH(dtrain::kernels::Scale)
DTRAIN_INSTANTIATE_LAUNCH(dtrain::kernels::Axpy)
DTRAIN_INSTANTIATE_LAUNCH(dtrain::kernels::PackBF16)
DTRAIN_INSTANTIATE_LAUNCH(dtrain::kernels::UnpackBF16)
DTRAIN_INSTANTIATE_LAUNCH(dtrain::kernels::PackFP16)
DTRAIN_INSTANTIATE_LAUNCH(dtrain::kernels::UnpackFP16)
