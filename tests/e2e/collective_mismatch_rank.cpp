// A rank of a job whose ranks issue different collectives through the library API, for
// collective_mismatch_test.sh. `MODE` picks the mismatch:
//   kinds:   rank 0 enters a barrier, the others a broadcast (MPI waits forever on both);
//   counts:  float32 all-reduces of different lengths (the shared-memory all-reduce);
//   checked: int32 all-reduces of different lengths, with --debug-collectives' header check;
//   rs_kinds: rank 0 reduce-scatters float32, the others all-reduce (the shared-memory check);
//   rs_counts: float32 reduce-scatters of different lengths over MPI (shared memory off: the
//              watchdog's board check);
//   rs_checked: int32 reduce-scatters of different lengths, with the header check;
//   rs_late: the last rank never joins a reduce-scatter (the deadline, 3 s here);
//   chain (np 3): rank 2 stops itself (SIGSTOP); rank 1 waits to receive from it on one
//     communicator, rank 0 waits for rank 1 in an all-reduce on another and times out first: its
//     line must name rank 2, which its own communicator does not hold (Note [Stopped ranks
//     beyond this communicator]).
// Without a check each would hang (or reduce mismatched buffers); the job must end with one line.
#include <csignal>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi_lifecycle.h"
#include "comm/runtime.h"
#include "core/error.h"

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const std::vector<std::string> modes = {"kinds", "counts", "checked", "rs_kinds", "rs_counts", "rs_checked", "rs_late", "chain"};
  if (std::find(modes.begin(), modes.end(), mode) == modes.end()) {
    std::fprintf(stderr, "usage: collective_mismatch_rank kinds|counts|checked|rs_kinds|rs_counts|rs_checked|rs_late|chain\n");
    return 2;
  }
  if (mode == "rs_counts") setenv("DTRAIN_SHM_ALLREDUCE", "0", 1);
  std::unique_ptr<dtrain::Runtime> rt;
  try {
    dtrain::RuntimeOptions options;
    options.device = dtrain::DeviceRequest::cpu();
    // chain: 6 s, so the stopped rank is stale (2 s without a heartbeat) well before rank 0's deadline.
    options.collective_timeout_s = mode == "rs_late" ? 3 : mode == "chain" ? 6 : 120;  // else far beyond the test's limit: the check must end it
    options.debug_collectives = mode == "checked" || mode == "rs_checked";
    options.concurrent_communicators = mode == "chain";  // split() needs MPI_THREAD_MULTIPLE
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
    } else if (mode == "checked") {
      comm.allreduce(i.data(), rank == 0 ? 1000 : 2000, dtrain::DType::kI32, dtrain::ReduceOp::kSum);
    } else if (mode == "rs_kinds") {
      if (rank == 0) comm.reduce_scatter(f.data(), f.data(), 1000, dtrain::DType::kF32, dtrain::ReduceOp::kSum);
      else comm.allreduce(f.data(), 1000, dtrain::DType::kF32, dtrain::ReduceOp::kSum);
    } else if (mode == "rs_counts") {
      std::vector<float> out(2000);
      comm.reduce_scatter(f.data(), out.data(), rank == 0 ? 1000 : 2000, dtrain::DType::kF32, dtrain::ReduceOp::kSum);
    } else if (mode == "rs_checked") {
      std::vector<int32_t> out(2000);
      comm.reduce_scatter(i.data(), out.data(), rank == 0 ? 1000 : 2000, dtrain::DType::kI32, dtrain::ReduceOp::kSum);
    } else if (mode == "chain") {
      if (comm.size() != 3) throw dtrain::Error("chain needs 3 ranks");
      auto pair = comm.split(rank == 2 ? 1 : 0, rank, "pair");     // ranks 0 and 1: the all-reduce
      auto chain = comm.split(rank == 0 ? 1 : 0, rank, "chain");   // ranks 1 and 2: the transfer
      comm.barrier();
      if (rank == 2) {
        std::raise(SIGSTOP);
      } else if (rank == 1) {
        // Long after rank 0's all-reduce, so rank 0's deadline passes first even on a loaded box.
        std::this_thread::sleep_for(std::chrono::seconds(12));
        chain->recv(f.data(), 1000, dtrain::DType::kF32, 1);
      } else {
        pair->allreduce(f.data(), 1000, dtrain::DType::kF32, dtrain::ReduceOp::kSum);
      }
    } else {
      comm.barrier();  // every rank is up, so only the reduce-scatter can be late
      if (rank == comm.size() - 1) std::this_thread::sleep_for(std::chrono::seconds(60));
      std::vector<float> out(1000);
      comm.reduce_scatter(f.data(), out.data(), 1000, dtrain::DType::kF32, dtrain::ReduceOp::kSum);
    }
    std::printf("rank %d: the mismatched collective completed\n", rank);
  } catch (const std::exception& e) {
    dtrain::abort_all(e.what());
  }
  rt.reset();
  return 0;
}
