// The runtime for MPI tests: mpi_test_main.cpp starts dtrain once per process (CPU device) and
// every test reaches the runtime and its communicator through these.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "comm/communicator.h"
#include "comm/runtime.h"

namespace dtrain::testing {

Runtime& test_runtime();
inline Communicator& test_comm() { return test_runtime().control(); }

// True on every rank iff `mine` is bit for bit rank 0's (the same length on every rank).
// Collective over test_comm().
inline bool bitwise_equal_on_all_ranks(const std::vector<float>& mine) {
  std::vector<float> root = mine;
  test_comm().broadcast(root.data(), static_cast<int64_t>(root.size()), DType::kF32, 0);
  int32_t differ = !mine.empty() && std::memcmp(mine.data(), root.data(), mine.size() * sizeof(float)) != 0;
  test_comm().allreduce(&differ, 1, DType::kI32, ReduceOp::kSum);
  return differ == 0;
}

}  // namespace dtrain::testing
