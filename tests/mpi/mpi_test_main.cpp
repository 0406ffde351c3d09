// main() for MPI tests: initialises dtrain (MPI) once, silences gtest output on ranks other
// than 0, and makes every rank agree on the result so a failure on any rank fails the run.
#include <gtest/gtest.h>

#include "comm/init.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  dtrain::DistributedContext ctx = dtrain::init(&argc, &argv);
  if (ctx.comm->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int32_t any_failed = failed;
  ctx.comm->allreduce(&any_failed, 1, dtrain::DType::kI32, dtrain::ReduceOp::kSum);
  dtrain::finalize(ctx);
  return any_failed ? 1 : 0;
}
