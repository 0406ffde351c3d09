// HierarchicalCommunicator: node, leaders and world MpiCommunicators driven in order from one
// queue thread (see the Notes in the header).
#include "comm/hierarchical_communicator.h"

#include <cstring>

#include <fmt/format.h>

#include "comm/mpi_check.h"
#include "comm/mpi_types.h"

namespace dtrain {

NodeLayout probe_node_layout(MPI_Comm comm) {
  NodeLayout layout;
  int rank = 0, local_rank = 0, local_size = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &layout.world_size));
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  MPI_CHECK(MPI_Comm_rank(node, &local_rank));
  MPI_CHECK(MPI_Comm_size(node, &local_size));
  MPI_CHECK(MPI_Comm_free(&node));
  int leader = local_rank == 0 ? 1 : 0;
  MPI_CHECK(MPI_Allreduce(&leader, &layout.nodes, 1, MPI_INT, MPI_SUM, comm));
  MPI_CHECK(MPI_Allreduce(&local_size, &layout.max_local_size, 1, MPI_INT, MPI_MAX, comm));
  return layout;
}

HierarchicalCommunicator::HierarchicalCommunicator(MPI_Comm parent, const CollectiveOptions& options) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(parent, &rank));
  MPI_CHECK(MPI_Comm_split_type(parent, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node_comm_));
  int local_rank = 0;
  MPI_CHECK(MPI_Comm_rank(node_comm_, &local_rank));
  // Leaders are ordered by world rank, so the leaders' all-reduce is the same on every run.
  MPI_CHECK(MPI_Comm_split(parent, local_rank == 0 ? 0 : MPI_UNDEFINED, rank, &leaders_comm_));
  // Decided on every rank alike: a node of one rank still takes part in the stages when others
  // have several, or the ranks would issue different collectives.
  const NodeLayout layout = probe_node_layout(parent);
  nodes_ = layout.nodes;
  staged_ = layout.max_local_size > 1;
  CollectiveOptions world_options = options;
  world_options.shared_memory_allreduce = false;  // its all-reduces are the flat path (one node per leader)
  world_ = std::make_unique<MpiCommunicator>(parent, world_options);
  node_ = std::make_unique<MpiCommunicator>(node_comm_, options);  // every rank on one node: shm for float32
  if (leaders_comm_ != MPI_COMM_NULL) leaders_ = std::make_unique<MpiCommunicator>(leaders_comm_, options);
}

HierarchicalCommunicator::~HierarchicalCommunicator() = default;

std::string HierarchicalCommunicator::describe() const {
  return fmt::format("mpi (hierarchical all-reduce: {} in each of {} nodes, MPI among the leaders)",
                     node_->shared_memory_allreduce() ? "shared memory" : "MPI", nodes_);
}

WorkHandle HierarchicalCommunicator::in_order(std::function<void()> job) { return queue_.submit(std::move(job)); }

void HierarchicalCommunicator::allreduce_stages(void* buf, int64_t count, DType dtype, ReduceOp op) {
  if (!leaders_) {
    // Not a leader: its part of the node sum, then the leader's result. Both run on the node
    // communicator's thread in this order, so they need not be waited for one by one.
    WorkHandle node_sum = node_->allreduce_async(buf, count, dtype, ReduceOp::kSum);
    node_->broadcast(buf, count, dtype, 0);
    node_sum->wait();  // rethrows a failure of the first stage, if any
    return;
  }
  node_->allreduce(buf, count, dtype, ReduceOp::kSum);
  if (leaders_->size() > 1) leaders_->allreduce(buf, count, dtype, ReduceOp::kSum);
  // Divided once, by the leader, so every rank of the node gets the leader's bits.
  if (op == ReduceOp::kAvg) divide_in_place(buf, count, dtype, size());
  node_->broadcast(buf, count, dtype, 0);
}

WorkHandle HierarchicalCommunicator::allreduce_async(void* buf, int64_t count, DType dtype, ReduceOp op) {
  DTRAIN_CHECK(count >= 0, "allreduce: negative count {}", count);
  DTRAIN_CHECK(count == 0 || buf != nullptr, "allreduce: null buffer for {} elements", count);
  DTRAIN_CHECK(op != ReduceOp::kAvg || !is_integer(dtype), "allreduce: ReduceOp::kAvg needs a floating-point dtype, got {}",
               dtype_name(dtype));
  if (count == 0) return WorkQueue::completed();
  if (!staged_) return in_order([=, this] { world_->allreduce(buf, count, dtype, op); });
  return in_order([=, this] { allreduce_stages(buf, count, dtype, op); });
}

WorkHandle HierarchicalCommunicator::broadcast_async(void* buf, int64_t count, DType dtype, int root) {
  DTRAIN_CHECK(root >= 0 && root < size(), "broadcast: root {} is not a rank of {}", root, size());
  return in_order([=, this] { world_->broadcast(buf, count, dtype, root); });
}

WorkHandle HierarchicalCommunicator::allgather_async(const void* send, void* recv, int64_t count_per_rank,
                                                     DType dtype) {
  return in_order([=, this] { world_->allgather(send, recv, count_per_rank, dtype); });
}

WorkHandle HierarchicalCommunicator::reduce_scatter_async(const void* send, void* recv, int64_t count_per_rank,
                                                          DType dtype, ReduceOp op) {
  DTRAIN_CHECK(count_per_rank >= 0, "reduce_scatter: negative count {}", count_per_rank);
  DTRAIN_CHECK(count_per_rank == 0 || (send != nullptr && recv != nullptr),
               "reduce_scatter: null buffer for {} elements per rank", count_per_rank);
  DTRAIN_CHECK(op != ReduceOp::kAvg || !is_integer(dtype),
               "reduce_scatter: ReduceOp::kAvg needs a floating-point dtype, got {}", dtype_name(dtype));
  if (count_per_rank == 0) return WorkQueue::completed();
  if (!staged_) return in_order([=, this] { world_->reduce_scatter(send, recv, count_per_rank, dtype, op); });
  // Note [Hierarchical reduce-scatter and all-gather].
  return in_order([=, this] {
    const size_t block = static_cast<size_t>(count_per_rank) * dtype_size(dtype);
    staging_.resize(block * static_cast<size_t>(size()));
    std::memcpy(staging_.data(), send, staging_.size());
    allreduce_stages(staging_.data(), count_per_rank * size(), dtype, op);
    std::memcpy(recv, staging_.data() + block * static_cast<size_t>(rank()), block);
  });
}

WorkHandle HierarchicalCommunicator::barrier_async() {
  return in_order([this] { world_->barrier(); });
}

WorkHandle HierarchicalCommunicator::batch_p2p_async(std::vector<P2pOp>) {
  throw Error("mpi (hierarchical): point-to-point send/recv on a communicator that runs collectives: split() a "
              "communicator of its own for it (Note [Point-to-point])");
}

std::unique_ptr<Communicator> HierarchicalCommunicator::split(int color, int key, const std::string& name) {
  queue_.submit([] {})->wait();  // after every collective already issued
  return world_->split(color, key, name);
}

Tensor HierarchicalCommunicator::allocate_reduce_buffer(int64_t numel, DType dtype, Device device) {
  queue_.submit([] {})->wait();  // "no collective in flight", as the node communicator requires
  return node_->allocate_reduce_buffer(numel, dtype, device);
}

void HierarchicalCommunicator::shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  queue_.drain_and_stop();
  if (leaders_) leaders_->shutdown();
  node_->shutdown();
  world_->shutdown();
  if (leaders_comm_ != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(&leaders_comm_));
  MPI_CHECK(MPI_Comm_free(&node_comm_));
}

}  // namespace dtrain
