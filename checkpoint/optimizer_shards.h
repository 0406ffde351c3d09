// Sharded optimizer state on disk (Note [Sharded optimizer state] in checkpoint_layout.h): the
// shard files' names, the "<offset>,<numel>,<full shape>" metadata of each piece, the manifest
// a rank sends before its bytes, and OptimizerFiles, the optimizer file(s) of a checkpoint
// opened, checked and indexed so that any range of any tensor is read from whichever files hold
// it (pread: never a whole file in memory). No MPI here: train/optimizer_transfer.h moves the
// bytes between ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/safetensors.h"
#include "checkpoint/training_state.h"

namespace dtrain::checkpoint {

// "optimizer-rank<r>-of-<n>.safetensors".
std::string optimizer_shard_name(int64_t rank, int64_t shards);

// Elements [offset, offset + numel) of the flattened tensor `name` whose shape is `full_shape`.
struct Piece {
  std::string name;
  int64_t offset = 0;
  int64_t numel = 0;
  Shape full_shape;
  bool operator==(const Piece&) const = default;
};
// "<offset>,<numel>,[<d0>,<d1>,...]" ("0,6,[2,3]"; a 0-d tensor's shape is "[]").
std::string encode_piece(const Piece& piece);
// The piece `text` describes; nullopt unless it is exactly encode_piece's form with offset >= 0,
// numel >= 0 and offset + numel within the full shape's element count.
std::optional<Piece> parse_piece(std::string name, std::string_view text);

// One tensor of a shard file: a piece and how its bytes are stored (1-D of numel elements for a
// slice; a whole tensor keeps its shape).
struct ShardTensor {
  Piece piece;
  safetensors::Dtype dtype = safetensors::Dtype::kF32;
  Shape stored_shape;
};
struct ShardCount {
  std::string name;
  int64_t value = 0;
};

// What one rank's shard file holds, known before any byte of it is sent: rank 0 writes the header
// from it, then the tensors' bytes in data order (specs()'s data_order).
struct ShardManifest {
  std::vector<ShardTensor> tensors;
  std::vector<ShardCount> counts;  // stored as 0-d I64 tensors, as optimizer.safetensors stores them
  safetensors::Metadata metadata;  // the optimizer's own ("optimizer": "adamw"); pieces are added

  std::vector<safetensors::TensorSpec> specs() const;  // tensors first, then counts
  safetensors::Metadata file_metadata() const;         // metadata plus one entry per tensor
  std::string encode() const;
  static ShardManifest decode(std::string_view text);  // throws Error on a malformed manifest
};

// A piece of a tensor as one file stores it.
struct StoredPiece {
  int file = 0;           // index into OptimizerFiles::sources()
  int64_t offset = 0;     // element offset into the flattened tensor
  int64_t numel = 0;
  uint64_t data_begin = 0;  // byte offset of its first element in the file
};
// A tensor of the optimizer state and where its pieces lie, sorted by offset and covering it
// exactly once.
struct StoredTensor {
  std::string name;
  safetensors::Dtype dtype = safetensors::Dtype::kF32;
  Shape full_shape;
  std::vector<StoredPiece> pieces;
  int64_t numel() const { return shape_numel(full_shape); }
};

// The optimizer file(s) of one checkpoint, open for reading ranges.
class OptimizerFiles {
 public:
  // Opens the checkpoint's optimizer.safetensors or its state.optimizer_shards shard files and
  // checks each (size and CRC-32 against state.json, read in chunks; the header; every piece's
  // metadata; counts that agree) and that the pieces of each tensor cover it exactly once.
  // Throws one line naming the file and the tensor. Non-finite values are found in the same
  // reading but not refused here (nonfinite(): a resume refuses them, reading weights does not).
  static OptimizerFiles open(const std::filesystem::path& dir, const TrainingState& state);
  OptimizerFiles(OptimizerFiles&&) noexcept;
  OptimizerFiles& operator=(OptimizerFiles&&) noexcept;
  ~OptimizerFiles();

  bool sharded() const { return sharded_; }  // shard files, not optimizer.safetensors
  const std::vector<std::string>& sources() const { return sources_; }  // the files' paths
  // The optimizer's metadata (shard 0's, without the pieces' entries).
  const safetensors::Metadata& metadata() const { return metadata_; }
  const std::vector<StoredTensor>& tensors() const { return tensors_; }  // sorted by name
  const std::vector<ShardCount>& counts() const { return counts_; }      // sorted by name
  const StoredTensor* find(std::string_view name) const;
  // "<file>: <tensor>: <count> non-finite value(s) (first: nan at index 3)" for the first
  // tensor holding a NaN or an infinity, "" when every value is finite.
  const std::string& nonfinite() const { return nonfinite_; }
  // Copies elements [offset, offset + numel) of `tensor` into `dst` (numel elements of its
  // dtype), reading only those bytes from whichever files hold them.
  void read(const StoredTensor& tensor, int64_t offset, int64_t numel, std::byte* dst) const;

 private:
  OptimizerFiles() = default;
  bool sharded_ = false;
  std::vector<std::string> sources_;
  std::vector<int> fds_;
  safetensors::Metadata metadata_;
  std::vector<StoredTensor> tensors_;
  std::vector<ShardCount> counts_;
  std::string nonfinite_;
};

// The chunk in which a file is read for its checksum, and the most a rank sends at once.
inline constexpr size_t kStreamChunkBytes = size_t{16} << 20;

// Writes the whole optimizer state `files` hold to `path` as one file laid out as an unsharded
// save's optimizer.safetensors (whole tensors under their names, the counts, the optimizer's
// metadata: the same bytes for the same state), tensor by tensor in chunks of `chunk_bytes`, so
// never more than one chunk in memory. Atomic: a temporary beside `path`, fsynced, renamed.
// Returns the bytes written.
uint64_t consolidate(const OptimizerFiles& files, const std::string& path, size_t chunk_bytes = kStreamChunkBytes);

}  // namespace dtrain::checkpoint
