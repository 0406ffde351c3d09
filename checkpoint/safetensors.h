// safetensors: the tensor file format of Hugging Face's `safetensors` (what PyTorch users load).
//   8 bytes   N, the header length, unsigned little-endian
//   N bytes   a JSON object: {"__metadata__": {str: str}, "<name>": {"dtype": "F32", "shape": [..],
//             "data_offsets": [begin, end]}, ...}, padded with spaces so the data starts 8-aligned
//   the rest  the data buffer; the offsets are relative to its start and cover it exactly
// This file owns the dtypes, the header (encode and strict parse), and whole-file read and write.
// Writing goes through a ByteSink so the checkpoint writer can checksum, fsync and inject faults.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace dtrain::checkpoint {
class HostBufferPool;
}

namespace dtrain::safetensors {

// The format's dtypes. Order is by element size (as the reference implementation's), so sorting
// the data by descending dtype keeps every tensor aligned to its element size.
enum class Dtype : uint8_t { kBool, kU8, kI8, kI16, kF16, kBF16, kI32, kF32, kI64, kF64 };
size_t dtype_size(Dtype dtype);
std::string_view dtype_name(Dtype dtype);  // "F32"
std::optional<Dtype> parse_dtype(std::string_view name);
// The core dtypes map onto the format's; the format's others have no core Tensor.
Dtype from_core(DType dtype);
std::optional<DType> to_core(Dtype dtype);

using Metadata = std::map<std::string, std::string>;

// A tensor to write: its bytes are borrowed and must stay alive during the write.
struct TensorRef {
  std::string name;
  Dtype dtype = Dtype::kF32;
  Shape shape;
  std::span<const std::byte> bytes;
};

// A tensor whose bytes this process owns on the host, unchanging: what a snapshot taken
// between training steps is made of (copying a HostTensor shares the bytes).
struct HostTensor {
  std::string name;
  Dtype dtype = Dtype::kF32;
  Shape shape;
  std::shared_ptr<const std::byte> data;
  size_t nbytes = 0;

  std::span<const std::byte> bytes() const { return {data.get(), nbytes}; }
  TensorRef ref() const { return {name, dtype, shape, bytes()}; }
};

// A host copy of `t` (from any device): the caller may change `t` once this returns. With a
// pool, the copy lands in reused memory (see host_buffer_pool.h: much faster for large states).
HostTensor host_copy(std::string name, const Tensor& t, checkpoint::HostBufferPool* pool = nullptr);
// `t` itself, kept alive, without a copy: for a CPU tensor nothing writes any more (such as the
// copies Optimizer::export_state returns).
HostTensor adopt_host_tensor(std::string name, Tensor t);
// A 0-d int64 tensor, as optimizers' step counts are stored.
HostTensor i64_scalar(std::string name, int64_t value);
std::vector<TensorRef> refs(std::span<const HostTensor> tensors);

// Where one tensor lies in a file's data buffer.
struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::kF32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data buffer
};

struct Header {
  std::vector<TensorInfo> tensors;  // sorted by name
  Metadata metadata;
};

// The header JSON for `tensors`, laid out as write() lays out the data, padded with spaces to a
// multiple of 8 bytes (the 8-byte length prefix is not included). Keys are sorted.
std::string encode_header(std::span<const TensorRef> tensors, const Metadata& metadata);

// A tensor's name, dtype and shape without its bytes: what a file written piece by piece
// (write_header, then the data in data_order) declares before its data exists in memory.
struct TensorSpec {
  std::string name;
  Dtype dtype = Dtype::kF32;
  Shape shape;
};
std::string encode_header(std::span<const TensorSpec> tensors, const Metadata& metadata);
// The order of the tensors' data in the file: indices into `tensors`.
std::vector<size_t> data_order(std::span<const TensorSpec> tensors);
// numel * the dtype's size (the shape must be valid).
uint64_t nbytes_of(const TensorSpec& spec);

// The largest header accepted, as the reference implementation's limit.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// Parses and validates a header against a data buffer of `data_bytes` bytes. Throws Error
// "<source>: <problem>" (one line) on invalid JSON, a duplicate key, an unknown dtype, a shape
// whose size disagrees with its offsets, offsets out of range, overlapping, leaving a gap or
// leaving bytes after the last tensor, or a non-string metadata value.
Header parse_header(std::string_view json, uint64_t data_bytes, std::string_view source);

// Where write() sends bytes. Implementations throw Error on failure.
class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual void write(std::span<const std::byte> bytes) = 0;
};

// Writes a complete safetensors file to `sink` (tensor names must be unique). Returns the bytes
// written.
uint64_t write(ByteSink& sink, std::span<const TensorRef> tensors, const Metadata& metadata);
// The length prefix and the header of a file holding `tensors`; the caller then writes each
// tensor's bytes in data_order(tensors), in pieces of any size. Returns the bytes written.
uint64_t write_header(ByteSink& sink, std::span<const TensorSpec> tensors, const Metadata& metadata);

// A safetensors file read completely into memory and validated.
class File {
 public:
  // Takes the whole file's bytes; `source` names it in errors. Throws Error as parse_header.
  File(std::unique_ptr<std::byte[]> bytes, uint64_t size, std::string source);

  const std::string& source() const { return source_; }
  const Header& header() const { return header_; }
  const Metadata& metadata() const { return header_.metadata; }
  const TensorInfo* find(std::string_view name) const;  // nullptr when absent
  const TensorInfo& at(std::string_view name) const;    // throws "<source>: no tensor '<name>'"
  std::span<const std::byte> bytes(const TensorInfo& info) const;
  // The whole file as read (rank 0 can broadcast it; other ranks rebuild a File from it).
  std::span<const std::byte> file_bytes() const { return {bytes_.get(), static_cast<size_t>(size_)}; }

  // Copies a tensor into `dst` (any device) after checking dtype and shape ("<source>: tensor
  // '1.weight' has shape [10, 256], expected [10, 128]").
  void copy_to(std::string_view name, Tensor& dst) const;
  // A new CPU tensor with the stored values (core dtypes only).
  Tensor to_tensor(std::string_view name) const;
  // A 0-d (or one-element) I64 tensor's value.
  int64_t i64_scalar(std::string_view name) const;

 private:
  std::unique_ptr<std::byte[]> bytes_;
  uint64_t size_ = 0;
  uint64_t data_start_ = 0;
  std::string source_;
  Header header_;
};

// Reads and validates a file (never allocates more than the file's size plus the header).
File read_file(const std::string& path);

// A file's header read and validated without its data (the file's size stands for the data's);
// its tensors are then read one at a time: how a pipeline stage takes its own tensors from a
// whole model's file (Note [Stage construction] in model/models.h) without holding the file.
class FileIndex {
 public:
  explicit FileIndex(const std::string& path);  // throws Error "<path>: <problem>" as File does
  const std::string& source() const { return source_; }
  const Header& header() const { return header_; }
  const TensorInfo& at(std::string_view name) const;  // throws "<source>: no tensor '<name>'"
  std::vector<std::byte> read(const TensorInfo& info) const;

 private:
  std::string source_;
  uint64_t data_start_ = 0;
  Header header_;
};
// Writes a file (not atomically: checkpoint_writer.h writes checkpoints atomically).
void write_file(const std::string& path, std::span<const TensorRef> tensors, const Metadata& metadata = {});

// One target of load_named(): a tensor the file must hold under `name`, with its dtype and shape.
struct NamedTarget {
  std::string name;
  Tensor* tensor;
};
// Copies every target from the file after checking that the file holds exactly these names with
// these dtypes and shapes; throws one line naming the first mismatch (targets in order first,
// then a tensor in the file that no target names).
void load_named(const File& file, std::span<const NamedTarget> targets);
// The checks of load_named: `header` holds exactly `expected` (names, dtypes, shapes).
void check_holds(const Header& header, std::string_view source, std::span<const TensorSpec> expected);

}  // namespace dtrain::safetensors
