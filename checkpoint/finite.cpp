#include "checkpoint/finite.h"

#include <cmath>
#include <cstring>

#include <fmt/format.h>

namespace dtrain::checkpoint {

namespace {

template <class T>
NonfiniteValues scan(std::span<const std::byte> bytes) {
  NonfiniteValues found;
  const size_t n = bytes.size() / sizeof(T);
  for (size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, bytes.data() + i * sizeof(T), sizeof(T));  // the file's data need not be aligned for T
    if (std::isfinite(v)) continue;
    if (found.count++ == 0) {
      found.first_index = static_cast<int64_t>(i);
      found.first_value = static_cast<double>(v);
    }
  }
  return found;
}

}  // namespace

NonfiniteValues find_nonfinite(safetensors::Dtype dtype, std::span<const std::byte> bytes) {
  switch (dtype) {
    case safetensors::Dtype::kF32: return scan<float>(bytes);
    case safetensors::Dtype::kF64: return scan<double>(bytes);
    default: return {};
  }
}

std::string describe(const NonfiniteValues& v) {
  // fmt prints a NaN whatever its sign bit as "nan" or "-nan": say "nan", as PyTorch prints it.
  const std::string first = std::isnan(v.first_value) ? "nan" : fmt::format("{}", v.first_value);
  return fmt::format("{} non-finite value(s) (first: {} at index {})", v.count, first, v.first_index);
}

std::string first_nonfinite_tensor(std::span<const safetensors::HostTensor> tensors) {
  for (const safetensors::HostTensor& t : tensors) {
    const NonfiniteValues v = find_nonfinite(t.dtype, t.bytes());
    if (v.count > 0) return fmt::format("{}: {}", t.name, describe(v));
  }
  return "";
}

std::string first_nonfinite_tensor(const safetensors::File& file) {
  for (const safetensors::TensorInfo& info : file.header().tensors) {
    const NonfiniteValues v = find_nonfinite(info.dtype, file.bytes(info));
    if (v.count > 0) return fmt::format("{}: {}", info.name, describe(v));
  }
  return "";
}

}  // namespace dtrain::checkpoint
