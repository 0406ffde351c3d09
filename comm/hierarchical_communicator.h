// HierarchicalCommunicator: the CPU Communicator for jobs that span nodes with several ranks on
// a node. An all-reduce runs in three stages (Note [Hierarchy]): inside each node through the
// shared-memory path, among one leader per node over MPI, and back inside the node. Every other
// collective runs over the whole world. It is composed of MpiCommunicators (world, node,
// leaders) and adds no MPI of its own beyond splitting the communicators.
//
// Note [Hierarchy]: a flat MPI_Allreduce over TCP sends every rank's data between nodes; here
// only the leaders do, once per node, and the ranks inside a node meet in shared memory. Stage
// 1: the node communicator all-reduces (float32 through ShmAllreduce, other types with MPI over
// shared memory). Stage 2: the leaders (local rank 0) all-reduce the node sums over MPI. Stage 3:
// each leader divides for an average, then broadcasts to its node. Only the leaders hold the
// global result before stage 3, so every rank gets the leader's bits, and leaders agree with
// each other because MPI_Allreduce gives every leader the same bits.
//
// Note [Hierarchical reduce-scatter and all-gather]: a reduce-scatter all-reduces the whole
// buffer through the three stages (into a staging copy, so `send` is left as it was) and keeps
// this rank's block. It moves what an all-reduce moves, not the (N-1)/N of a ring
// reduce-scatter, but each block has exactly the bits the hierarchical all-reduce gives those
// elements (ZeRO-2 then equals plain DDP bitwise across nodes too), and a leader's cross-node
// share could not be one contiguous block anyway: a node's ranks need not be consecutive world
// ranks. The flight recorders hold its stages (an allreduce of size() x count_per_rank
// elements, then the node's broadcast), as they do an all-reduce's. An all-gather is
// MPI_Allgather over the world (the flat collective; each rank's block
// crosses the network once either way). When every node has one rank both are flat MPI.
//
// Note [One MPI caller at a time]: MPI runs at MPI_THREAD_SERIALIZED. Each MpiCommunicator has
// its own communication thread; this class's own queue thread drives the stages and waits for
// each before issuing the next, so at most one of those threads is inside MPI at any time, and
// collectives run in the order they were issued.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <mpi.h>

#include "comm/allreduce_algorithm.h"
#include "comm/communicator.h"
#include "comm/mpi_communicator.h"
#include "comm/work_queue.h"

namespace dtrain {

// The layout of the ranks of `comm` (collective; call it where MPI may be called).
NodeLayout probe_node_layout(MPI_Comm comm);

class HierarchicalCommunicator final : public Communicator {
 public:
  // Collective over `parent` (which the caller keeps): splits it into node and leader
  // communicators. Call it from the thread that owns MPI with no other MPI call in flight.
  // `options` go to each MpiCommunicator it is made of (each stage has the deadline).
  explicit HierarchicalCommunicator(MPI_Comm parent, const CollectiveOptions& options = {});
  ~HierarchicalCommunicator() override;

  int rank() const override { return world_->rank(); }
  int size() const override { return world_->size(); }
  int local_rank() const override { return node_->rank(); }
  int local_size() const override { return node_->size(); }
  int nodes() const { return nodes_; }
  std::string backend() const override { return "mpi"; }
  std::string describe() const override;
  Stream& stream() override { return world_->stream(); }

  // Any dtype MpiCommunicator takes; count 0 is a completed no-op.
  WorkHandle allreduce_async(void* buf, int64_t count, DType dtype, ReduceOp op) override;
  WorkHandle broadcast_async(void* buf, int64_t count, DType dtype, int root) override;
  WorkHandle allgather_async(const void* send, void* recv, int64_t count_per_rank, DType dtype) override;
  // Note [Hierarchical reduce-scatter and all-gather]; in place when recv is this rank's block.
  WorkHandle reduce_scatter_async(const void* send, void* recv, int64_t count_per_rank, DType dtype,
                                  ReduceOp op) override;
  WorkHandle barrier_async() override;
  // Point-to-point runs on a sub-communicator of its own (Note [Point-to-point]): this throws so.
  WorkHandle batch_p2p_async(std::vector<P2pOp> ops) override;
  // A flat MpiCommunicator over the world communicator's split (with the shared-memory
  // all-reduce when the group is on one node), in order with this one's collectives.
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;
  // The node communicator's buffers (node-shared windows for float32), so stage 1 needs no copy.
  Tensor allocate_reduce_buffer(int64_t numel, DType dtype, Device device) override;
  void shutdown() override;

 private:
  void allreduce_stages(void* buf, int64_t count, DType dtype, ReduceOp op);  // on queue_'s thread
  // Runs `job` (which issues one sub-communicator collective and waits) on queue_'s thread, so
  // it is ordered with every other collective of this communicator.
  WorkHandle in_order(std::function<void()> job);

  MPI_Comm node_comm_ = MPI_COMM_NULL;
  MPI_Comm leaders_comm_ = MPI_COMM_NULL;  // MPI_COMM_NULL on ranks that are not leaders
  int nodes_ = 1;
  bool staged_ = true;  // false when every node has one rank: then it is a flat all-reduce
  std::unique_ptr<MpiCommunicator> world_;
  std::unique_ptr<MpiCommunicator> node_;
  std::unique_ptr<MpiCommunicator> leaders_;  // null on ranks that are not leaders
  std::vector<char> staging_;  // reduce_scatter's copy of `send` (used on queue_'s thread only)
  bool shut_down_ = false;
  WorkQueue queue_{"dtrain-hier"};  // last: its thread stops before the members above go
};

}  // namespace dtrain
