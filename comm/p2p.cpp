// Point-to-point batches: checks and texts (see p2p.h).
#include "comm/p2p.h"

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain {

namespace {

int world_of(const std::vector<int>& world_ranks, int r) {
  return r >= 0 && static_cast<size_t>(r) < world_ranks.size() ? world_ranks[static_cast<size_t>(r)] : r;
}

const char* direction(const P2pOp& op) { return op.kind == P2pOp::kSend ? "send" : "recv"; }

}  // namespace

void check_p2p_batch(const std::vector<P2pOp>& ops, int size, int64_t max_count) {
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2pOp& op = ops[i];
    DTRAIN_CHECK(op.peer >= 0 && op.peer < size, "{}: peer {} is not a rank of {}", direction(op), op.peer, size);
    DTRAIN_CHECK(op.tag >= 0 && op.tag <= kMaxP2pTag, "{}: tag {} is outside 0..{}", direction(op), op.tag,
                 kMaxP2pTag);
    DTRAIN_CHECK(op.count >= 0, "{}: negative count {}", direction(op), op.count);
    DTRAIN_CHECK(op.count == 0 || op.buf != nullptr, "{}: null buffer for {} elements", direction(op), op.count);
    DTRAIN_CHECK(op.count <= max_count, "{}: {} elements in one message exceed the backend's {}", direction(op),
                 op.count, max_count);
    for (size_t j = 0; j < i; ++j)
      DTRAIN_CHECK(ops[j].kind != op.kind || ops[j].peer != op.peer || ops[j].tag != op.tag,
                   "{}: two ops of one batch with peer {} and tag {} (they could match in either order)",
                   direction(op), op.peer, op.tag);
  }
}

const char* p2p_kind(const std::vector<P2pOp>& ops) {
  bool sends = false, recvs = false;
  for (const P2pOp& op : ops) (op.kind == P2pOp::kSend ? sends : recvs) = true;
  return sends && recvs ? "sendrecv" : sends ? "send" : "recv";
}

std::string p2p_text(const std::vector<P2pOp>& ops, const std::vector<int>& world_ranks) {
  std::string out;
  for (const P2pOp& op : ops)
    out += fmt::format("{}{} rank {} tag {} ({} {})", out.empty() ? "" : ", ", op.kind == P2pOp::kSend ? "to" : "from",
                       world_of(world_ranks, op.peer), op.tag, op.count, dtype_name(op.dtype));
  return out;
}

std::string p2p_count_mismatch(const P2pOp& recv, int64_t got, int peer_world_rank) {
  if (got == recv.count) return "";
  return fmt::format("recv from rank {} tag {}: expected {} {}, rank {} sent {}", peer_world_rank, recv.tag, recv.count,
                     dtype_name(recv.dtype), peer_world_rank,
                     got < 0 ? std::string("a message that is not a whole number of them")
                             : fmt::format("{}", got));
}

void pack_p2p_header(const P2pOp& send, int64_t out[4]) {
  out[0] = 1;
  out[1] = send.count;
  out[2] = static_cast<int64_t>(send.dtype);
  out[3] = send.tag;
}

std::string p2p_header_mismatch(const P2pOp& recv, const int64_t got[4], int peer_world_rank) {
  if (got[0] == 1 && got[1] == recv.count && got[2] == static_cast<int64_t>(recv.dtype) && got[3] == recv.tag) return "";
  return fmt::format("recv from rank {} tag {}: expected {} {}, rank {} sent {} {}", peer_world_rank, recv.tag,
                     recv.count, dtype_name(recv.dtype), peer_world_rank, got[1],
                     dtype_name(static_cast<DType>(got[2])));
}

}  // namespace dtrain
