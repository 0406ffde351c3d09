// The runtime for MPI tests: mpi_test_main.cpp starts dtrain once per process (CPU device) and
// every test reaches the runtime and its communicator through these.
#pragma once

#include "comm/communicator.h"
#include "comm/runtime.h"

namespace dtrain::testing {

Runtime& test_runtime();
inline Communicator& test_comm() { return test_runtime().control(); }

}  // namespace dtrain::testing
