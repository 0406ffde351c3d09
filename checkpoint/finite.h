// Finiteness of the tensors a checkpoint holds: a NaN or an infinity in a parameter or an
// optimizer buffer is never written (the writer refuses it) and never loaded (--init-weights,
// resuming). Floating-point dtypes only (F32, F64); the others cannot hold a non-finite value
// (F16 and BF16 are not read by dtrain's models). Pure functions over host bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "checkpoint/safetensors.h"

namespace dtrain::checkpoint {

// The non-finite values among a tensor's elements: how many, and the first one.
struct NonfiniteValues {
  int64_t count = 0;
  int64_t first_index = -1;
  double first_value = 0;
};

// `bytes` hold elements of `dtype` (their count times its size).
NonfiniteValues find_nonfinite(safetensors::Dtype dtype, std::span<const std::byte> bytes);

// "200704 non-finite value(s) (first: nan at index 0)".
std::string describe(const NonfiniteValues& values);

// The first tensor that holds a non-finite value, as "<name>: <describe()>"; "" when every one
// is finite.
std::string first_nonfinite_tensor(std::span<const safetensors::HostTensor> tensors);
std::string first_nonfinite_tensor(const safetensors::File& file);

}  // namespace dtrain::checkpoint
