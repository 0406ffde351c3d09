// Tiny kernels for the stream/event ordering tests, behind plain C++ functions so the test
// itself stays ordinary C++ (gtest is not compiled by nvcc).
#pragma once

#include <cstdint>

namespace dtrain::testing {

// On `stream`: spin for about `cycles` GPU clock cycles, then store `value` to *flag.
void spin_then_store(void* stream, int* flag, int value, int64_t cycles);
// On `stream`: *dst = *src.
void copy_int(void* stream, int* dst, const int* src);

// On `stream`: spin for about `cycles` GPU clock cycles (a late stream).
void spin(void* stream, int64_t cycles);

enum class Values { kF32, kBF16, kF16 };
// On `stream`: spin for about `cycles` GPU clock cycles (a late stream), then double the `count`
// values at `buf` (exact: the exponent moves by one; the values must be far from overflow). A
// one-rank all-reduce leaves its buffer as it was, so a reader that skipped its wait would go
// unnoticed; doubled values, written late, show it.
void spin_then_double(void* stream, void* buf, int64_t count, Values values, int64_t cycles);

}  // namespace dtrain::testing
