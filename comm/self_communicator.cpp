#include "comm/self_communicator.h"

#include <cstring>

#include "comm/work_queue.h"
#include "core/error.h"

namespace dtrain {

SelfCommunicator::SelfCommunicator() : stream_(make_stream(Device::cpu())) {}

WorkHandle SelfCommunicator::allreduce_async(void* buf, int64_t count, DType dtype, ReduceOp op) {
  DTRAIN_CHECK(count >= 0 && (count == 0 || buf != nullptr), "allreduce: {} elements at {}", count, buf);
  DTRAIN_CHECK(op != ReduceOp::kAvg || !is_integer(dtype), "allreduce: ReduceOp::kAvg needs a floating-point dtype, got {}",
               dtype_name(dtype));
  return WorkQueue::completed();
}

WorkHandle SelfCommunicator::broadcast_async(void* buf, int64_t count, DType, int root) {
  DTRAIN_CHECK(count >= 0 && (count == 0 || buf != nullptr), "broadcast: {} elements at {}", count, buf);
  DTRAIN_CHECK(root == 0, "broadcast: root {} is not a rank of 1", root);
  return WorkQueue::completed();
}

WorkHandle SelfCommunicator::allgather_async(const void* send, void* recv, int64_t count_per_rank, DType dtype) {
  DTRAIN_CHECK(count_per_rank >= 0, "allgather: negative count {}", count_per_rank);
  if (count_per_rank > 0 && send != recv)
    std::memmove(recv, send, static_cast<size_t>(count_per_rank) * dtype_size(dtype));
  return WorkQueue::completed();
}

WorkHandle SelfCommunicator::reduce_scatter_async(const void* send, void* recv, int64_t count_per_rank, DType dtype,
                                                   ReduceOp op) {
  DTRAIN_CHECK(count_per_rank >= 0 && (count_per_rank == 0 || (send != nullptr && recv != nullptr)),
               "reduce_scatter: {} elements from {} to {}", count_per_rank, send, recv);
  DTRAIN_CHECK(op != ReduceOp::kAvg || !is_integer(dtype),
               "reduce_scatter: ReduceOp::kAvg needs a floating-point dtype, got {}", dtype_name(dtype));
  if (count_per_rank > 0 && send != recv)
    std::memmove(recv, send, static_cast<size_t>(count_per_rank) * dtype_size(dtype));
  return WorkQueue::completed();
}

WorkHandle SelfCommunicator::barrier_async() { return WorkQueue::completed(); }

}  // namespace dtrain
