// AmpMode: automatic mixed precision for the matmul layers, like torch.autocast(bfloat16) for
// Linear. Master weights, gradients and the optimizer stay float32; with kBf16 a layer rounds
// its GEMM operands to bf16 and accumulates in float32 (core/ops.h gemm_bf16).
#pragma once

#include <string_view>

namespace dtrain {

enum class AmpMode { kOff, kBf16 };

constexpr std::string_view amp_name(AmpMode mode) { return mode == AmpMode::kBf16 ? "bf16" : "off"; }

}  // namespace dtrain
