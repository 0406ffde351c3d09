#include "comm/self_communicator.h"

#include <cstdint>
#include <cstring>

#include "comm/p2p.h"
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

WorkHandle SelfCommunicator::batch_p2p_async(std::vector<P2pOp> ops) {
  check_p2p_batch(ops, 1, INT64_MAX);
  for (const P2pOp& recv : ops) {
    if (recv.kind != P2pOp::kRecv) continue;
    const P2pOp* send = nullptr;
    for (const P2pOp& op : ops)
      if (op.kind == P2pOp::kSend && op.tag == recv.tag) send = &op;
    DTRAIN_CHECK(send != nullptr, "recv from rank 0 tag {}: no send of that tag in the same batch (one rank: it would "
                 "wait forever)", recv.tag);
    const int64_t got = send->dtype == recv.dtype ? send->count : -1;
    if (std::string differs = p2p_count_mismatch(recv, got, 0); !differs.empty()) throw Error(differs);
    if (recv.count > 0 && send->buf != recv.buf)
      std::memmove(recv.buf, send->buf, static_cast<size_t>(recv.count) * dtype_size(recv.dtype));
  }
  for (const P2pOp& send : ops) {
    if (send.kind != P2pOp::kSend) continue;
    bool matched = false;
    for (const P2pOp& op : ops) matched = matched || (op.kind == P2pOp::kRecv && op.tag == send.tag);
    DTRAIN_CHECK(matched, "send to rank 0 tag {}: no recv of that tag in the same batch (one rank: it would wait "
                 "forever)", send.tag);
  }
  return WorkQueue::completed();
}

std::unique_ptr<Communicator> SelfCommunicator::split(int color, int, const std::string&) {
  DTRAIN_CHECK(color >= 0, "split: color {} is negative", color);
  return std::make_unique<SelfCommunicator>();
}

}  // namespace dtrain
