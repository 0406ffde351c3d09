// AmpMode: automatic mixed precision for the matmul layers, like torch.autocast for Linear and
// Conv2d. Master weights, gradients and the optimizer stay float32; with kBf16 or kFp16 a layer
// rounds its GEMM operands to that 16-bit format and accumulates in float32 (core/ops.h
// gemm_half). fp16's range ends at 65504: gradients need loss scaling (model/grad_scaler.h).
#pragma once

#include <string_view>

#include "core/tensor.h"

namespace dtrain {

enum class AmpMode { kOff, kBf16, kFp16 };

constexpr std::string_view amp_name(AmpMode mode) {
  return mode == AmpMode::kBf16 ? "bf16" : mode == AmpMode::kFp16 ? "fp16" : "off";
}

// The GEMM operands' format under `mode`: DType::kBF16 or kF16, or kF32 when off.
constexpr DType amp_operand_dtype(AmpMode mode) {
  return mode == AmpMode::kBf16 ? DType::kBF16 : mode == AmpMode::kFp16 ? DType::kF16 : DType::kF32;
}

}  // namespace dtrain
