// NcclCommunicator: the Communicator over NCCL for GPU buffers. Built collectively from an
// existing (MPI) communicator that carries the NCCL unique id; collectives run on a dedicated
// communication stream (callers order it after the work that wrote a buffer: Note [Ordering a
// collective after its producer] in comm/communicator.h), each is recorded in the flight
// recorder the caller passes, and a watchdog thread turns a hung or failed collective into a
// one-line error and a non-zero exit instead of a hang (comm/nccl/nccl_watchdog.h). Built into
// the NCCL plugin (comm/nccl/nccl_plugin.h). No NCCL headers here.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "comm/collective_log.h"
#include "comm/communicator.h"
#include "core/device.h"

namespace dtrain {

struct NcclOptions {
  // A collective in flight longer than this fails the run (PyTorch's default, 10 minutes).
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  // How often the watchdog looks at in-flight collectives and NCCL's asynchronous errors.
  std::chrono::milliseconds poll_interval = std::chrono::milliseconds(5);
  // The device's compute stream (required): Work::wait() orders it after the collective. Passed
  // in rather than looked up, so the stream a caller computes on is the one it names.
  Stream* compute = nullptr;
  // Where each collective is recorded (enqueued and started when issued, finished when its
  // event completes); null records nothing. Must outlive the communicator.
  CollectiveLog* log = nullptr;
  // Writes that log when the watchdog fails the run or a dump is requested (the reason in, the
  // file or why not out); may be empty.
  std::function<std::string(const std::string& reason)> dump_log;
  // comm's count of dump requests (flight_recorder_dump_requests: SIGUSR1), which the plugin
  // cannot link: the watchdog writes `dump_log` when it grows (comm/dump_on_request.h). Null:
  // only a failure dumps.
  uint64_t (*dump_requests)() = nullptr;
  // Note [Device-timed collectives] (comm/communicator.h): CUDA timing events around each
  // collective and a clock anchor, so Work::device_timed(). Off, a collective costs no events
  // (a run without --trace or --metrics reads no device times).
  bool device_timing = false;
};

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

  // Buffers must be device memory on this communicator's device. A collective reads its buffer
  // when the communication stream reaches it: callers order that stream after the kernels that
  // wrote it (allreduce_after, comm/communicator.h). Work::wait() orders the compute stream
  // after the collective (no host block), except barrier's, which blocks the host.
  WorkHandle allreduce_async(void* buf, int64_t count, DType dtype, ReduceOp op) override;
  WorkHandle broadcast_async(void* buf, int64_t count, DType dtype, int root) override;
  // In place by NCCL's rules: allgather when send is this rank's block of recv, reduce_scatter
  // when recv is this rank's block of send (the other blocks of send are left as they were).
  WorkHandle allgather_async(const void* send, void* recv, int64_t count_per_rank, DType dtype) override;
  WorkHandle reduce_scatter_async(const void* send, void* recv, int64_t count_per_rank, DType dtype,
                                  ReduceOp op) override;
  WorkHandle barrier_async() override;
  // Note [Point-to-point]: ncclSend/ncclRecv between ncclGroupStart and ncclGroupEnd on the
  // communication stream, recorded and watched like a collective. NCCL carries no header: a
  // receive of another count than was sent is not named (the deadline ends it). Device buffers.
  WorkHandle batch_p2p_async(std::vector<P2pOp> ops) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain
