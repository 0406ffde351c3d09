// Dtype plumbing for MPI that needs no running MPI: datatypes per dtype and the in-place
// division that turns a sum into an average (rounded once per element for 16-bit floats).
#include "comm/mpi_types.h"

#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/kernels.h"

namespace dtrain {
namespace {

TEST(MpiTypes, DatatypePerDtype) {
  EXPECT_EQ(mpi_datatype(DType::kF32), MPI_FLOAT);
  EXPECT_EQ(mpi_datatype(DType::kI32), MPI_INT);
  EXPECT_EQ(mpi_datatype(DType::kBF16), MPI_UINT16_T);  // 16-bit floats travel as raw words
  EXPECT_EQ(mpi_datatype(DType::kF16), MPI_UINT16_T);
}

TEST(MpiTypes, DivideF32) {
  std::vector<float> v{3.0f, -6.0f, 1.0f};
  divide_in_place(v.data(), 3, DType::kF32, 3);
  EXPECT_EQ(v, (std::vector<float>{1.0f, -2.0f, 1.0f / 3.0f}));
}

TEST(MpiTypes, DivideHalfTypesRoundsOnce) {
  using namespace kernels;
  std::vector<uint16_t> b{float_to_bf16(3.0f), float_to_bf16(1.0f)};
  divide_in_place(b.data(), 2, DType::kBF16, 3);
  EXPECT_EQ(bf16_to_float(b[0]), 1.0f);
  EXPECT_EQ(b[1], float_to_bf16(1.0f / 3.0f));
  std::vector<uint16_t> h{float_to_fp16(6.0f), float_to_fp16(1.0f)};
  divide_in_place(h.data(), 2, DType::kF16, 3);
  EXPECT_EQ(fp16_to_float(h[0]), 2.0f);
  EXPECT_EQ(h[1], float_to_fp16(1.0f / 3.0f));
}

TEST(MpiTypes, DivideI32IsAnError) {
  int32_t v = 4;
  EXPECT_THROW(divide_in_place(&v, 1, DType::kI32, 2), Error);
  EXPECT_EQ(v, 4);
}

}  // namespace
}  // namespace dtrain
