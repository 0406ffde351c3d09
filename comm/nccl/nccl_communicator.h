// NcclCommunicator: the Communicator over NCCL for GPU buffers. Built collectively from an
// existing (MPI) communicator that carries the NCCL unique id; collectives run on a dedicated
// communication stream, ordered after the compute stream's work by events (no host sync),
// and a watchdog thread turns a hung or failed collective into a one-line error and a
// non-zero exit instead of a hang (comm/nccl/nccl_watchdog.h). No NCCL headers here.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "core/device.h"

namespace dtrain {

struct NcclOptions {
  // A collective in flight longer than this fails the run (PyTorch's default, 10 minutes).
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  // How often the watchdog looks at in-flight collectives and NCCL's asynchronous errors.
  std::chrono::milliseconds poll_interval = std::chrono::milliseconds(5);
};

// The entry point the GPU backend library exports for it (comm/runtime.cpp opens it by name):
//   extern "C" Communicator* <kNcclFactorySymbol>(Communicator& bootstrap, Device, const NcclOptions&)
inline constexpr const char* kNcclFactorySymbol = "dtrain_make_nccl_communicator_v1";

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `bootstrap`'s ranks (every rank calls it, same order as its other
  // collectives). Pins this process to `device` (CUDA). NCCL supports one rank per GPU.
  NcclCommunicator(Communicator& bootstrap, Device device, NcclOptions options = {});
  ~NcclCommunicator() override;  // waits for issued collectives (watched), then ncclCommDestroy
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override;
  int size() const override;
  int local_rank() const override;
  int local_size() const override;
  std::string backend() const override { return "nccl"; }
  Stream& stream() override;  // the communication stream

  // Buffers must be device memory on this communicator's device. Each call orders itself
  // after the work already queued on the compute stream; Work::wait() orders the compute
  // stream after the collective (no host block), except barrier's, which blocks the host.
  WorkHandle allreduce_async(void* buf, int64_t count, DType dtype, ReduceOp op) override;
  WorkHandle broadcast_async(void* buf, int64_t count, DType dtype, int root) override;
  WorkHandle allgather_async(const void* send, void* recv, int64_t count_per_rank, DType dtype) override;
  WorkHandle barrier_async() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain
