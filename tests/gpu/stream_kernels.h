// Tiny kernels for the stream/event ordering tests, behind plain C++ functions so the test
// itself stays ordinary C++ (gtest is not compiled by nvcc).
#pragma once

#include <cstdint>

namespace dtrain::testing {

// On `stream`: spin for about `cycles` GPU clock cycles, then store `value` to *flag.
void spin_then_store(void* stream, int* flag, int value, int64_t cycles);
// On `stream`: *dst = *src.
void copy_int(void* stream, int* dst, const int* src);

}  // namespace dtrain::testing
