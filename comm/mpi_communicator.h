// MpiCommunicator: the CPU Communicator over Open MPI. Every MPI call after construction runs
// on its one communication thread (a WorkQueue), in the order the collectives were issued, so
// MPI_THREAD_SERIALIZED suffices and *_async calls return at once.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <mpi.h>

#include "comm/collective_watchdog.h"
#include "comm/communicator.h"
#include "comm/flight_recorder.h"
#include "comm/mpi_types.h"
#include "comm/shm_allreduce.h"
#include "comm/work_queue.h"

namespace dtrain {

// Deadlines and the flight recorder (comm/collective_watchdog.h).
struct CollectiveOptions {
  double timeout_s = 600;              // per collective; 0: none
  size_t flight_recorder_size = 2000;  // collectives kept
  std::string flight_recorder_dir;     // where dumps go ("": the current directory)
  // Each MPI collective first all-reduces its header (Note [Checking every collective]).
  bool check_every_collective = false;
  // false: every all-reduce is MPI_Allreduce (the flat algorithm), even with every rank on one node.
  bool shared_memory_allreduce = true;
  // Whose collectives these are in flight-recorder dumps and `dtrain flight-report`: "mpi" for
  // the world, a name of its own for each sub-communicator (Note [Sub-communicators]).
  std::string name = "mpi";
};
// timeout_s 0 and flight_recorder_size 0: no recorder, no progress board, no watchdog thread
// (every rank then runs without them if any rank asked for none; see the constructor).

class MpiCommunicator final : public Communicator {
 public:
  // Duplicates `parent` (which the caller keeps), sets MPI_ERRORS_RETURN on the duplicate,
  // finds the node-local rank/size with MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), creates the
  // BF16/F16 ops and starts the communication thread. Call it from the thread that owns MPI
  // with no other MPI call in flight (MPI_THREAD_SERIALIZED).
  explicit MpiCommunicator(MPI_Comm parent, const CollectiveOptions& options = {});
  // Without shutdown(): queued collectives that have not started fail, a running one finishes,
  // and the MPI handles are left to process exit (no MPI call from a destructor).
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string backend() const override { return "mpi"; }
  std::string describe() const override;
  // True when float32 all-reduces go through the node-shared window (see ShmAllreduce).
  bool shared_memory_allreduce() const { return shm_ != nullptr; }
  // How many all-reduces, reduce-scatters and all-gathers went through it so far (0 when off).
  int64_t shared_memory_reductions() const { return shm_ ? shm_->reductions() : 0; }
  Stream& stream() override { return *stream_; }
  const FlightRecorder& flight_recorder() const { return recorder_; }

  // F32, I32, BF16, F16, U8. kAvg divides the sum by size() (float types only: I32/U8 throw here).
  // count 0 returns a completed Work without touching MPI. F32 goes through ShmAllreduce when
  // every rank is on this node (DTRAIN_SHM_ALLREDUCE=0 turns that off), else MPI_Allreduce.
  WorkHandle allreduce_async(void* buf, int64_t count, DType dtype, ReduceOp op) override;
  WorkHandle broadcast_async(void* buf, int64_t count, DType dtype, int root) override;
  // recv holds size() * count_per_rank elements, rank r's block at r * count_per_rank. `send`
  // may be this rank's own block of `recv` (then it is sent in place). Float32 on one node goes
  // through ShmAllreduce (no copy in when `recv` is an allocate_reduce_buffer window), else
  // MPI_Allgather.
  WorkHandle allgather_async(const void* send, void* recv, int64_t count_per_rank, DType dtype) override;
  // The dtypes and ops of allreduce_async; count_per_rank 0 is a completed no-op. Float32 on one
  // node goes through ShmAllreduce (each rank's block with the bits the shared-memory all-reduce
  // gives those elements), else MPI_Reduce_scatter_block (MPI_IN_PLACE when in place: the other
  // blocks of `send` are then MPI's scratch and hold nothing meaningful afterwards).
  WorkHandle reduce_scatter_async(const void* send, void* recv, int64_t count_per_rank, DType dtype,
                                  ReduceOp op) override;
  WorkHandle barrier_async() override;
  // Note [Point-to-point] (comm/communicator.h): MPI_Isend/MPI_Irecv for every op, then one
  // MPI_Waitall, on the communication thread. A communicator carries collectives or point-to-
  // point, not both (the first one issued decides; the other then throws): point-to-point
  // advances the sequence numbers of the ranks it involves only, and the deadline checks compare
  // collectives by sequence number across ranks. split() one off for point-to-point.
  WorkHandle batch_p2p_async(std::vector<P2pOp> ops) override;
  // MPI_Comm_split on the communication thread, then an MpiCommunicator over the result with
  // this one's options (the shared-memory all-reduce when the group is on one node) and `name`.
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;
  // CPU float32 buffers come from a node-shared window when the shared-memory all-reduce is
  // on (collective then: every rank calls it alike), so all-reduces of them need no copy in.
  Tensor allocate_reduce_buffer(int64_t numel, DType dtype, Device device) override;

  // Runs every queued collective, stops the communication thread, then frees the duplicate
  // communicator and the ops on the calling thread (which must be the one that owns MPI).
  // Later collectives throw dtrain::Error. Idempotent; dtrain::finalize() calls it.
  void shutdown() override;

 private:
  // Records the collective, then runs `body` on the communication thread under the watchdog.
  // Point-to-point (p2p) jobs are not on the progress board, whose checks compare collectives.
  WorkHandle submit(const char* kind, DType dtype, int64_t count, std::function<void(int64_t seq)> body,
                    bool p2p = false);
  // The first collective or point-to-point batch fixes which of the two this communicator runs.
  void claim_mode(bool p2p);
  void run_p2p(const std::vector<P2pOp>& ops);
  // After every rank arrived in shared-memory collective `seq` (`kind` of `count` float32): all
  // of them are in the same one.
  void check_same_collective(int64_t seq, const char* kind, int64_t count) const;
  // When collective `seq` failed with `error`: the line naming the ranks of this node that are
  // in it with another kind, count or dtype, or "" when the board shows none.
  std::string mismatch_behind(const std::string& error) const;
  // --debug-collectives: every rank's header of MPI collective `seq` agrees, or all throw.
  void check_header(int64_t seq, const char* kind, int64_t count, DType dtype);

  CollectiveOptions options_;
  std::vector<int> world_ranks_;  // world rank of each rank of comm_ (for messages)
  std::atomic<int> mode_{0};      // 0: nothing issued yet, 1: collectives, 2: point-to-point
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  std::unique_ptr<Stream> stream_;
  HalfSumOps ops_;
  std::unique_ptr<ShmAllreduce> shm_;
  FlightRecorder recorder_;
  std::unique_ptr<ProgressBoard> board_;
  std::unique_ptr<CollectiveWatchdog> watchdog_;  // null when timeouts and recording are off
  std::atomic<int64_t> unrecorded_seq_{0};         // sequence numbers without a recorder
  bool check_headers_ = false;
  bool shut_down_ = false;
  WorkQueue queue_{"dtrain-mpi"};  // last: its thread stops before the members above go
};

}  // namespace dtrain
