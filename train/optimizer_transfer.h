// Sharded optimizer state between the ranks and rank 0's files (Note [Sharded optimizer state]
// in checkpoint/checkpoint_layout.h), one chunk at a time: no rank ever holds more than its own
// slice plus one chunk. Only rank 0 touches files (train/root_broadcast.h: no shared filesystem).
//
// The Communicator has collectives only, no point-to-point send: a chunk goes from its owner to
// rank 0 (saving), or from rank 0 to its owner (loading), as a broadcast with that root. The other
// ranks receive it into their one chunk buffer and drop it: memory stays bounded, the traffic is
// (ranks - 1) times what a send would move, on the control communicator, at a save or a resume.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/optimizer_shards.h"
#include "comm/communicator.h"
#include "model/optimizer.h"

namespace dtrain {

// What a transfer moved, for tests and logs.
struct TransferStats {
  uint64_t bytes = 0;        // tensor bytes that crossed between ranks
  int64_t chunks = 0;        // collectives that carried them
  size_t largest_chunk = 0;  // the most bytes one collective carried
};

// Collective: whether the ranks' exports are shards of one state (ZeRO) rather than replicas:
// some rank exports a slice, or the ranks export different entries (a ZeRO rank that owns whole
// parameters exports them whole, and only those). Every rank gets the same answer.
bool agree_sharded(Communicator& control, const OptimizerState& state);

// The shard file that `state` (this rank's export) makes: its pieces, counts and `metadata`.
checkpoint::ShardManifest shard_manifest(const OptimizerState& state, const safetensors::Metadata& metadata);

// "<file>: <tensor>: <count> non-finite value(s) ..." for this rank's first non-finite slice
// (`file` names its shard), "" when all are finite; read one chunk at a time.
std::string first_nonfinite_slice(const OptimizerState& state, const std::string& file, size_t chunk_bytes);

// Collective: rank 0 writes every rank's `state` as optimizer_shard_name(rank, size) into `save`
// (rank 0's; null on the others), streaming: a rank's manifest, then its tensors' bytes in chunks
// of at most `chunk_bytes`. The tensors may live on any device (the caller has synchronised the
// stream that wrote them). When rank 0 cannot write, every rank throws the same AgreedError once
// every chunk has moved (no rank is left waiting) and `save` must be dropped unpublished.
void send_optimizer_shards(Communicator& control, const OptimizerState& state, const safetensors::Metadata& metadata,
                           checkpoint::ShardedSave* save, size_t chunk_bytes, TransferStats* stats = nullptr);

// Collective (Note [Pipeline checkpoints] in train/checkpointer.h): rank 0 writes `file_name`
// (model.safetensors) into `save` (rank 0's; null on the others) holding the whole model's
// tensors `whole` in that order's names and shapes, with `metadata`; each tensor's bytes come from
// the lowest rank whose `mine` (its stage's parameters, whole) holds it, in chunks of at most
// `chunk_bytes`, so no rank holds more than its stage and one chunk. Errors as
// send_optimizer_shards'.
void send_stage_model(Communicator& control, const OptimizerState& mine, std::span<const safetensors::TensorSpec> whole,
                      const safetensors::Metadata& metadata, const std::string& file_name,
                      checkpoint::ShardedSave* save, size_t chunk_bytes);

// The pieces of the optimizer state a rank asks for when it resumes: nullopt for every tensor of
// the checkpoint whole (an optimizer without ZeRO), else (ZeRO) exactly its slices for the new
// run's layout. A piece of a tensor the checkpoint does not hold is left out of the answer (that
// parameter had not been updated yet: it starts fresh).
using WantedPieces = std::optional<std::vector<checkpoint::Piece>>;
// The pieces a ZeRO `optimizer` owns under its store's current layout: for each parameter it
// holds a part of and each state key, Piece{"<parameter>.<key>", offset, count, its shape}.
std::vector<checkpoint::Piece> wanted_pieces(const Optimizer& optimizer);

// Collective: every rank receives what it `wanted` from `files` (rank 0's; null on the others),
// streamed in chunks of at most `chunk_bytes`, as an OptimizerState of CPU tensors (slices
// 1-D with their offset and full shape; whole tensors in their shape) with every count. A piece
// that does not fit the checkpoint's tensor (another full shape) is the same AgreedError on
// every rank, naming the file and the tensor. A rank that asked for pieces gets the counts of
// the parameters whose pieces it got (a ZeRO optimizer keeps counts for those only); one that
// asked for everything gets every count.
OptimizerState receive_optimizer_state(Communicator& control, const checkpoint::OptimizerFiles* files,
                                       const WantedPieces& wanted, size_t chunk_bytes,
                                       TransferStats* stats = nullptr);

}  // namespace dtrain
