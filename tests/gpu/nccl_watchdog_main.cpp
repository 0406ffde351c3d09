// Hang safety, end to end: rank 0 issues an all-reduce (or, with the argument
// "reduce_scatter", a reduce-scatter) that rank 1 never joins. Rank 0's watchdog must print
// "dtrain: rank 0: NCCL allreduce #1 timed out after ..." (reduce_scatter) and exit non-zero
// within seconds, so mpirun ends the job instead of hanging. CTest passes on that line and
// skips on "dtrain-test-skip:" (fewer GPUs than local ranks).
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>

#include "comm/runtime.h"
#include "comm/nccl/nccl_communicator.h"
#include "core/cuda/cuda_backend.h"
#include "core/stream.h"
#include "core/device_select.h"
#include "core/tensor.h"

int main(int argc, char** argv) {
  dtrain::RuntimeOptions cpu;
  cpu.device = dtrain::DeviceRequest::cpu();  // the NCCL communicator below is made by hand
  std::unique_ptr<dtrain::Runtime> runtime = dtrain::init(&argc, &argv, cpu);
  dtrain::Communicator& world = runtime->control();
  const bool reduce_scatter = argc > 1 && std::string(argv[1]) == "reduce_scatter";
  int32_t ok = dtrain::cuda::device_count() >= world.local_size() ? 1 : 0;
  world.allreduce(&ok, 1, dtrain::DType::kI32, dtrain::ReduceOp::kSum);
  if (ok != world.size()) {
    if (world.rank() == 0) {
      const std::string why = dtrain::cuda::device_count_error();
      std::printf("dtrain-test-skip: needs one GPU per local rank (%d local ranks; rank 0 sees %d%s%s)\n",
                  world.local_size(), dtrain::cuda::device_count(), why.empty() ? "" : ": ", why.c_str());
    }
    runtime.reset();
    return 0;
  }
  try {
    dtrain::DeviceChoice choice = dtrain::select_device(dtrain::DeviceRequest::cuda(), world.local_rank(), world.local_size(), false);
    dtrain::NcclOptions options;
    options.timeout = std::chrono::seconds(5);
    options.compute = &dtrain::compute_stream(choice.device);
    dtrain::NcclCommunicator nccl(world, choice.device, options);
    dtrain::Tensor t = dtrain::Tensor::zeros({1024}, choice.device);
    if (world.rank() == 0) {
      // Never matched by rank 1.
      if (reduce_scatter) nccl.reduce_scatter(t.raw(), t.raw(), 1024 / world.size(), dtrain::DType::kF32, dtrain::ReduceOp::kSum);
      else nccl.allreduce(t, dtrain::ReduceOp::kSum);
      t.to_vector();                             // blocks on the result until the watchdog ends the process
      std::printf("rank 0: the unmatched all-reduce completed: the watchdog did not fire\n");
    } else {
      std::this_thread::sleep_for(std::chrono::seconds(90));  // mpirun kills this rank once rank 0 exits
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", world.rank(), e.what());
  }
  return 3;  // reaching here is a failure either way; the pass condition is the watchdog's line
}
