// A rank of a job whose ranks issue different collectives through the library API, for
// collective_mismatch_test.sh. `MODE` picks the mismatch:
//   kinds:   rank 0 enters a barrier, the others a broadcast (MPI waits forever on both);
//   counts:  float32 all-reduces of different lengths (the shared-memory all-reduce);
//   checked: int32 all-reduces of different lengths, with --debug-collectives' header check.
// Without a check each would hang (or reduce mismatched buffers); the job must end with one line.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "comm/mpi_lifecycle.h"
#include "comm/runtime.h"
#include "core/error.h"

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "kinds" && mode != "counts" && mode != "checked") {
    std::fprintf(stderr, "usage: collective_mismatch_rank kinds|counts|checked\n");
    return 2;
  }
  std::unique_ptr<dtrain::Runtime> rt;
  try {
    dtrain::RuntimeOptions options;
    options.device = dtrain::DeviceRequest::cpu();
    options.collective_timeout_s = 120;  // far beyond the test's limit: the check must end it
    options.debug_collectives = mode == "checked";
    rt = dtrain::init(&argc, &argv, options);
    dtrain::Communicator& comm = rt->control();
    const int rank = comm.rank();
    std::vector<float> f(1 << 20, 1.f);
    std::vector<int32_t> i(1 << 20, 1);
    if (mode == "kinds") {
      if (rank == 0) comm.barrier();
      else comm.broadcast(i.data(), static_cast<int64_t>(i.size()), dtrain::DType::kI32, 1);
    } else if (mode == "counts") {
      comm.allreduce(f.data(), rank == 0 ? 1000 : 2000, dtrain::DType::kF32, dtrain::ReduceOp::kSum);
    } else {
      comm.allreduce(i.data(), rank == 0 ? 1000 : 2000, dtrain::DType::kI32, dtrain::ReduceOp::kSum);
    }
    std::printf("rank %d: the mismatched collective completed\n", rank);
  } catch (const std::exception& e) {
    dtrain::abort_all(e.what());
  }
  rt.reset();
  return 0;
}
