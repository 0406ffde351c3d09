// Helpers the communicator tests under mpirun share: MPI_COMM_WORLD's rank and size (for tests
// that make communicators of their own), the error a call threw, and the 16-bit float cases.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/tensor.h"

namespace dtrain::testing {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// Runs `issue` and returns the dtrain::Error it threw ("" when none).
template <class F>
std::string error_of(F issue) {
  try {
    issue();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A 16-bit float type and its conversions, for results compared with float32's.
struct HalfCase {
  DType dtype;
  uint16_t (*pack)(float);
  float (*unpack)(uint16_t);
  double rel_tol;  // bf16: 8 significant bits, fp16: 11 (a rounding per add, a few ranks)
};

}  // namespace dtrain::testing
