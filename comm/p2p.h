// Point-to-point batches (Note [Point-to-point] in comm/communicator.h): the checks and texts
// every backend shares. Pure; tested without MPI.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace dtrain {

// Throws dtrain::Error naming the first bad op: a peer outside [0, size), a tag outside
// [0, kMaxP2pTag], a negative count, a null buffer with elements, more than `max_count`
// elements in one op, or two ops of the batch with the same peer, direction and tag (MPI would
// match them in either order).
void check_p2p_batch(const std::vector<P2pOp>& ops, int size, int64_t max_count);

// The flight recorder's kind: "send", "recv" or "sendrecv" (both directions in the batch).
const char* p2p_kind(const std::vector<P2pOp>& ops);

// For labels and errors: "to rank 2 tag 5 (64 float32), from rank 0 tag 4 (64 float32)".
// `world_ranks[r]` is the world rank of communicator rank r (empty: the ranks as they are).
std::string p2p_text(const std::vector<P2pOp>& ops, const std::vector<int>& world_ranks);

// A receive's check of what arrived. `got` elements of the op's dtype (-1: not a whole number of
// them); "" when it is what the op expected.
std::string p2p_count_mismatch(const P2pOp& recv, int64_t got, int peer_world_rank);

// Header of a send when headers are checked: {kind 1, count, dtype, tag}; the receive's
// comparison of the header it got with its own op ("" when they agree).
void pack_p2p_header(const P2pOp& send, int64_t out[4]);
std::string p2p_header_mismatch(const P2pOp& recv, const int64_t got[4], int peer_world_rank);

}  // namespace dtrain
