// main() for MPI tests: starts dtrain (MPI, CPU device) once, silences gtest output on ranks
// other than 0, and makes every rank agree on the result so a failure on any rank fails the run.
#include <gtest/gtest.h>

#include <cstdlib>
#include <exception>
#include <memory>

#include "comm/mpi_lifecycle.h"
#include "tests/mpi/mpi_test_env.h"

namespace dtrain::testing {

namespace {
std::unique_ptr<Runtime> g_runtime;
}

Runtime& test_runtime() { return *g_runtime; }

}  // namespace dtrain::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto& runtime = dtrain::testing::g_runtime;
  try {
    dtrain::RuntimeOptions options;
    options.device = dtrain::DeviceRequest::cpu();
    // Tests of sub-communicators (tests/CMakeLists.txt sets it for them).
    options.concurrent_communicators = std::getenv("DTRAIN_TEST_CONCURRENT_COMMUNICATORS") != nullptr;
    runtime = dtrain::init(&argc, &argv, options);
  } catch (const std::exception& e) {
    dtrain::abort_all(e.what());
  }
  if (runtime->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int32_t any_failed = failed;
  try {
    runtime->control().allreduce(&any_failed, 1, dtrain::DType::kI32, dtrain::ReduceOp::kSum);
    runtime.reset();
  } catch (const std::exception& e) {
    dtrain::abort_all(e.what());
  }
  return any_failed ? 1 : 0;
}
