// CUDA instantiations of the GPT layers' device-generic kernels (model/gpt_kernels.h).
#include "core/cuda/launch.cuh"
#include "model/gpt_kernels.h"

DTRAIN_REGISTER_KERNEL(dtrain::kernels::AddTensors)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::AccumulateInto)
DTRAIN_REGISTER_ROW_KERNEL(dtrain::kernels::LayerNormForward)
DTRAIN_REGISTER_ROW_KERNEL(dtrain::kernels::LayerNormBackward)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::LayerNormParamPartial)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::LayerNormParamGrad)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::GeluForward)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::GeluBackward)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::EmbeddingForward)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::MergeByToken)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::TokenOffsets)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::IotaI32)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::EmbeddingBackward)
DTRAIN_REGISTER_KERNEL(dtrain::kernels::PositionBackward)
