// How dtrain's dtypes travel over MPI: the MPI datatype per DType, the summing MPI_Op per
// DType (built-in MPI_SUM for F32/I32; user ops for BF16/F16, which MPI has no type for), and
// the in-place division that turns a sum into an average.
#pragma once

#include <cstdint>

#include <mpi.h>

#include "core/tensor.h"

namespace dtrain {

// MPI_FLOAT, MPI_INT, MPI_UINT8_T, or MPI_UINT16_T for the 16-bit floats (moved as raw words).
MPI_Datatype mpi_datatype(DType dtype);

// The summing ops for BF16 and F16 words: each element is widened to float, added, and rounded
// back (round to nearest even), so the sum of two values is what one bf16/fp16 add gives.
// Commutative. Owns the MPI_Op handles: create and free them where MPI may be called.
class HalfSumOps {
 public:
  HalfSumOps();   // MPI_Op_create twice
  ~HalfSumOps();  // no MPI call: release() must have run (or MPI be gone)
  HalfSumOps(const HalfSumOps&) = delete;
  HalfSumOps& operator=(const HalfSumOps&) = delete;

  void release();  // MPI_Op_free both; idempotent
  // MPI_SUM for F32/I32/U8, the user op for BF16/F16.
  MPI_Op sum(DType dtype) const;

 private:
  MPI_Op bf16_ = MPI_OP_NULL;
  MPI_Op fp16_ = MPI_OP_NULL;
};

// buf[i] /= divisor for F32/BF16/F16 (16-bit values widened, divided, rounded back). I32/U8 throw.
void divide_in_place(void* buf, int64_t count, DType dtype, int divisor);

}  // namespace dtrain
