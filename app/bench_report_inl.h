// encode_values (template) for app/bench_report.h.
#pragma once

#include <cstring>

#include "core/kernels.h"

namespace dtrain {

template <class Value>
std::vector<uint8_t> encode_values(DType dtype, int64_t count, Value value) {
  std::vector<uint8_t> bytes(static_cast<size_t>(count) * dtype_size(dtype));
  for (int64_t i = 0; i < count; ++i) {
    const float v = value(i);
    if (dtype == DType::kBF16) {
      const uint16_t h = kernels::float_to_bf16(v);
      std::memcpy(bytes.data() + i * 2, &h, 2);
    } else {
      std::memcpy(bytes.data() + i * 4, &v, 4);
    }
  }
  return bytes;
}

}  // namespace dtrain
