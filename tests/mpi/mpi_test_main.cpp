// main() for MPI tests: initialises dtrain (MPI) once, silences gtest output on ranks other
// than 0, and makes every rank agree on the result so a failure on any rank fails the run.
#include <gtest/gtest.h>

#include <exception>

#include "comm/init.h"
#include "tests/mpi/mpi_test_env.h"

namespace dtrain::testing {

namespace {
DistributedContext g_context;
}

DistributedContext& test_context() { return g_context; }

}  // namespace dtrain::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  dtrain::DistributedContext& ctx = dtrain::testing::test_context();
  try {
    ctx = dtrain::init(&argc, &argv);
  } catch (const std::exception& e) {
    dtrain::abort_all(e.what());
  }
  if (ctx.comm->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int32_t any_failed = failed;
  try {
    ctx.comm->allreduce(&any_failed, 1, dtrain::DType::kI32, dtrain::ReduceOp::kSum);
    dtrain::finalize(ctx);
  } catch (const std::exception& e) {
    dtrain::abort_all(e.what());
  }
  return any_failed ? 1 : 0;
}
