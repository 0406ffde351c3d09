// MPI datatypes and summing ops for dtrain's dtypes, and the average's division.
#include "comm/mpi_types.h"

#include "comm/mpi_check.h"
#include "core/kernels.h"

namespace dtrain {

namespace {

// MPI_User_function bodies: inout[i] = in[i] + inout[i] in float, rounded back to 16 bits.
// `len` counts 16-bit words (the ops are only applied to MPI_UINT16_T buffers).
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i)
    b[i] = kernels::float_to_bf16(kernels::bf16_to_float(a[i]) + kernels::bf16_to_float(b[i]));
}

void fp16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i)
    b[i] = kernels::float_to_fp16(kernels::fp16_to_float(a[i]) + kernels::fp16_to_float(b[i]));
}

}  // namespace

MPI_Datatype mpi_datatype(DType dtype) {
  switch (dtype) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kI32: return MPI_INT;
    case DType::kBF16:
    case DType::kF16: return MPI_UINT16_T;
    case DType::kU8: return MPI_UINT8_T;
    case DType::kI64: return MPI_INT64_T;
  }
  throw Error(fmt::format("no MPI datatype for dtype {}", static_cast<int>(dtype)));
}

HalfSumOps::HalfSumOps() {
  MPI_CHECK(MPI_Op_create(&bf16_sum, /*commute=*/1, &bf16_));
  MPI_CHECK(MPI_Op_create(&fp16_sum, /*commute=*/1, &fp16_));
}

HalfSumOps::~HalfSumOps() = default;

void HalfSumOps::release() {
  if (bf16_ != MPI_OP_NULL) MPI_CHECK(MPI_Op_free(&bf16_));
  if (fp16_ != MPI_OP_NULL) MPI_CHECK(MPI_Op_free(&fp16_));
}

MPI_Op HalfSumOps::sum(DType dtype) const {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
    case DType::kU8:
    case DType::kI64: return MPI_SUM;
    case DType::kBF16: return bf16_;
    case DType::kF16: return fp16_;
  }
  throw Error(fmt::format("no MPI sum op for dtype {}", static_cast<int>(dtype)));
}

void divide_in_place(void* buf, int64_t count, DType dtype, int divisor) {
  const float d = static_cast<float>(divisor);
  switch (dtype) {
    case DType::kF32: {
      auto* x = static_cast<float*>(buf);
      for (int64_t i = 0; i < count; ++i) x[i] /= d;
      return;
    }
    case DType::kBF16: {
      auto* x = static_cast<uint16_t*>(buf);
      for (int64_t i = 0; i < count; ++i) x[i] = kernels::float_to_bf16(kernels::bf16_to_float(x[i]) / d);
      return;
    }
    case DType::kF16: {
      auto* x = static_cast<uint16_t*>(buf);
      for (int64_t i = 0; i < count; ++i) x[i] = kernels::float_to_fp16(kernels::fp16_to_float(x[i]) / d);
      return;
    }
    case DType::kI32:
    case DType::kU8:
    case DType::kI64: break;
  }
  throw Error(fmt::format("ReduceOp::kAvg needs a floating-point dtype, got {}", dtype_name(dtype)));
}

}  // namespace dtrain
