// Communicator: the collectives a data-parallel trainer needs, independent of backend.
// MpiCommunicator (CPU, Open MPI) and NcclCommunicator (GPU) implement it. comm/ knows
// nothing of models: it moves typed buffers.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/stream.h"
#include "core/tensor.h"

namespace dtrain {

enum class ReduceOp { kSum, kAvg };  // kAvg: the sum divided by size()

// One half of a point-to-point transfer (Note [Point-to-point]): `count` elements of `dtype` to
// or from rank `peer` of the communicator, matched with the peer's opposite op of the same tag.
struct P2pOp {
  enum Kind { kSend, kRecv } kind = kSend;
  void* buf = nullptr;  // read by a send, written by a receive
  int64_t count = 0;
  DType dtype = DType::kF32;
  int peer = 0;
  int tag = 0;  // 0 .. kMaxP2pTag
};
constexpr int kMaxP2pTag = 16383;  // MPI guarantees tags up to 32767; the rest carry headers

// A collective in flight. wait() returns when the result may be used by the caller's compute
// stream (host-blocking on MPI; stream-ordered, without blocking the host, on NCCL); it throws
// dtrain::Error if the collective failed or timed out. test() never blocks.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;

  // Steady-clock nanoseconds (steady_now_ns()) when the backend started and finished running
  // the collective on the host, 0 until known. Traces use them; MPI fills both.
  virtual int64_t started_ns() const { return started_ns_.load(std::memory_order_acquire); }
  virtual int64_t finished_ns() const { return finished_ns_.load(std::memory_order_acquire); }

  // Note [Device-timed collectives]: on a GPU, wait() returns before the collective ran (it
  // only orders the compute stream after it), so host times say nothing of it. A device-timed
  // Work (NCCL, when the communicator was asked: NcclOptions::device_timing, which the Runtime
  // sets from RuntimeOptions::device_timing) records timing events on the communication stream
  // around the collective;
  // wait_for_device_times() blocks the host until the collective finished on the device and
  // then makes started_ns()/finished_ns() the device's start and end, on the steady clock.
  virtual bool device_timed() const { return false; }
  virtual void wait_for_device_times() {}

 protected:
  std::atomic<int64_t> started_ns_{0}, finished_ns_{0};
};

inline int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
using WorkHandle = std::shared_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;   // rank among the processes on this node
  virtual int local_size() const = 0;
  virtual std::string backend() const = 0;  // "mpi", "nccl" or "self"
  // The backend and how it moves data, for logs: "mpi (shared-memory all-reduce)".
  virtual std::string describe() const { return backend(); }
  // The stream the collectives run on; callers order it after a buffer's producer first
  // (Note [Ordering a collective after its producer]).
  virtual Stream& stream() = 0;

  // Asynchronous collectives: they return at once; buffers must stay alive until wait().
  // Every rank must issue the same collectives in the same order.
  virtual WorkHandle allreduce_async(void* buf, int64_t count, DType dtype, ReduceOp op) = 0;
  virtual WorkHandle broadcast_async(void* buf, int64_t count, DType dtype, int root) = 0;
  virtual WorkHandle allgather_async(const void* send, void* recv, int64_t count_per_rank, DType dtype) = 0;
  // `send` holds size() blocks of count_per_rank elements; rank r receives the reduction over
  // every rank of block r in `recv` (count_per_rank elements). In place when recv == send + r *
  // count_per_rank (NCCL's rule; ZeRO-2 reduces a bucket into its owner's slice that way); the
  // other blocks of `send` may then be used as scratch (MPI's in-place form does). Same
  // deadlines, flight recorder (count per rank) and consistency checks as allreduce_async. On
  // one node, float32 blocks have the bits the all-reduce gives those elements (MPI's shared-
  // memory path, HierarchicalCommunicator). Until a backend has its own, this one throws naming
  // the backend. (allgather_async is in place when send == recv + r * count_per_rank.)
  virtual WorkHandle reduce_scatter_async(const void* send, void* recv, int64_t count_per_rank, DType dtype,
                                          ReduceOp op);
  virtual WorkHandle barrier_async() = 0;

  // Note [Point-to-point]: the ops of one batch are all posted at once and the Work completes
  // when every one of them has (PyTorch's batch_isend_irecv; MPI_Isend/MPI_Irecv + MPI_Waitall,
  // ncclGroupStart/ncclSend/ncclRecv/ncclGroupEnd). A send and the receive it needs from the same
  // peer in one batch cannot wait on each other, which is how a pipeline schedule avoids the
  // deadlock two blocking sends make (pipeline/schedule.h checks its batches for that). Batches
  // run in issue order with the collectives (one FIFO per communicator), under the same
  // deadline and in the same flight recorder (kinds "send", "recv", "sendrecv"; the label names
  // the peers). A receive checks what arrives: another element count or dtype is an error naming
  // the peer, the tag and both sides (MPI: Note [Point-to-point headers]). Unlike a collective, only the
  // ranks named take part. Backends without it throw naming themselves.
  virtual WorkHandle batch_p2p_async(std::vector<P2pOp> ops);
  WorkHandle send_async(const void* buf, int64_t count, DType dtype, int peer, int tag = 0) {
    return batch_p2p_async({P2pOp{P2pOp::kSend, const_cast<void*>(buf), count, dtype, peer, tag}});
  }
  WorkHandle recv_async(void* buf, int64_t count, DType dtype, int peer, int tag = 0) {
    return batch_p2p_async({P2pOp{P2pOp::kRecv, buf, count, dtype, peer, tag}});
  }

  // Note [Sub-communicators]: a communicator of the ranks that pass the same `color` (ordered by
  // `key`, then rank), for a process grid: a pipeline stage's data-parallel group, a pipeline's
  // chain of stages. Collective over this communicator (every rank calls it, in the same order
  // as its collectives, none in flight). `name` tells its flight recorder apart in dumps
  // (flight_recorder_rank<R>_<name>.json, a section of `dtrain flight-report`); give every
  // sub-communicator a name of its own. The child has its own FIFO, deadline and recorder, so
  // it runs alongside this one (MPI: needs MPI_THREAD_MULTIPLE, RuntimeOptions::
  // concurrent_communicators). Backends without it throw naming themselves.
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name);

  // A zeroed buffer for in-place all-reduces of `numel` elements. A backend that reduces faster
  // from memory of its own (MpiCommunicator: a node-shared window, so no copy in) hands that
  // out. It may be collective: every rank calls it alike (same sizes, same order) with no
  // collective in flight. The buffer must not be used after the communicator shuts down.
  virtual Tensor allocate_reduce_buffer(int64_t numel, DType dtype, Device device) {
    return Tensor::zeros({numel}, device, dtype);
  }

  // Finishes every collective already issued and releases the backend's resources (call it from
  // the thread that created the communicator). Later collectives throw. Idempotent.
  virtual void shutdown() {}

  // Blocking forms.
  void allreduce(void* buf, int64_t count, DType dtype, ReduceOp op) { allreduce_async(buf, count, dtype, op)->wait(); }
  void broadcast(void* buf, int64_t count, DType dtype, int root) { broadcast_async(buf, count, dtype, root)->wait(); }
  void allgather(const void* send, void* recv, int64_t count_per_rank, DType dtype) {
    allgather_async(send, recv, count_per_rank, dtype)->wait();
  }
  void barrier() { barrier_async()->wait(); }
  void reduce_scatter(const void* send, void* recv, int64_t count_per_rank, DType dtype, ReduceOp op) {
    reduce_scatter_async(send, recv, count_per_rank, dtype, op)->wait();
  }
  void send(const void* buf, int64_t count, DType dtype, int peer, int tag = 0) {
    send_async(buf, count, dtype, peer, tag)->wait();
  }
  void recv(void* buf, int64_t count, DType dtype, int peer, int tag = 0) {
    recv_async(buf, count, dtype, peer, tag)->wait();
  }

  // Tensor conveniences (in place, whole tensor), ordered after the kernels queued on the
  // tensor's compute stream (Note [Ordering a collective after its producer]), unlike the raw
  // forms above, whose caller says what to wait for.
  void allreduce(Tensor& t, ReduceOp op);
  void broadcast(Tensor& t, int root);
};

// Note [Ordering a collective after its producer]: a collective reads its buffer when the
// communicator's stream gets to it. On a GPU the kernels that wrote the buffer run on another
// stream (the compute stream), so nothing makes the collective wait for them unless it is said:
// an event recorded on the producer's stream after those kernels, and the communicator's stream
// waits on it (no host block; on CPU both calls are no-ops, since CPU work is done when queued).
// allreduce_after is the one place that is said for a bucket's all-reduce: every comm hook,
// plain or compressed, issues through it, after its own kernels (the 16-bit pack) are queued;
// the reducer and the backends do no ordering of their own. Work::wait() orders the other way.
inline WorkHandle Communicator::reduce_scatter_async(const void*, void*, int64_t, DType, ReduceOp) {
  throw Error(backend() + ": reduce_scatter is not implemented for this backend");
}

inline WorkHandle Communicator::batch_p2p_async(std::vector<P2pOp>) {
  throw Error(backend() + ": point-to-point send/recv is not implemented for this backend");
}
inline std::unique_ptr<Communicator> Communicator::split(int, int, const std::string&) {
  throw Error(backend() + ": sub-communicators are not implemented for this backend");
}

inline void order_after(Stream& producer, Communicator& comm) { comm.stream().wait(*producer.record()); }
inline void Communicator::allreduce(Tensor& t, ReduceOp op) {
  order_after(compute_stream(t.device()), *this);
  allreduce(t.raw(), t.numel(), t.dtype(), op);
}
inline void Communicator::broadcast(Tensor& t, int root) {
  order_after(compute_stream(t.device()), *this);
  broadcast(t.raw(), t.numel(), t.dtype(), root);
}

inline WorkHandle allreduce_after(Stream& producer, Communicator& comm, void* buf, int64_t count, DType dtype,
                                  ReduceOp op) {
  order_after(producer, comm);
  return comm.allreduce_async(buf, count, dtype, op);
}

}  // namespace dtrain
