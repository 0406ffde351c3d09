// The world communicator for MPI tests: mpi_test_main.cpp initialises dtrain once per process
// and every test reaches the communicator through these.
#pragma once

#include "comm/communicator.h"
#include "comm/init.h"

namespace dtrain::testing {

DistributedContext& test_context();
inline Communicator& test_comm() { return *test_context().comm; }

}  // namespace dtrain::testing
