// GPU kernels for the elementwise functors of core/kernels.h. A functor added there needs a line
// here, or launching it on a GPU fails with an error naming its type.
#include "core/cuda/launch.cuh"
#include "core/kernels.h"

DTRAIN_REGISTER_KERNEL(dtrain::kernels::Fill)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::Scale)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::Axpy)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::PackBF16)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::UnpackBF16)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::PackFP16)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::UnpackFP16)
DTRAIN_REGISTER_ROW_KERNEL(dtrain::kernels::CopyRows)
DTRAIN_REGISTER_ROW_KERNEL(dtrain::kernels::PackRowsHalf)
