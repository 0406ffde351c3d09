// IDX files (the MNIST family's format): reading, gzip-compressed or raw, with every header
// and size check done up front, and a writer the tests use to make fixtures.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dtrain {

// An IDX array of unsigned bytes: dims[0] is the item count (e.g. {60000, 28, 28}).
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;  // row-major, shape_numel(dims) bytes
};

// The memory a payload may take, and where the figure comes from (named in the error).
struct MemoryAvailable {
  size_t bytes = 0;
  std::string source;  // "MemAvailable", "the cgroup's memory limit"
};

struct IdxReadLimits {
  // 0 bytes: measured at each read (/proc/meminfo's MemAvailable, or less left under the cgroup's
  // memory limit). Tests pass a figure.
  MemoryAvailable memory_available;
};

// Reads `path`, gzip (detected by the 1f 8b magic) or raw. Throws dtrain::Error with one line
// naming the file and the problem: missing/unreadable file, bad magic, element type other
// than unsigned byte, ndim outside 1..4, a zero dimension, truncated data, trailing data,
// corrupt gzip stream. A well-formed gzip file is decoded whole by libdeflate, anything else by
// zlib's stream, with the same checks and messages (Note [Two gzip decoders]); bytes after the
// last gzip member are ignored, as zlib and gzip do. Before any payload is allocated
// (Note [Bounded decompression]) the header's declared size is checked against what the file can
// hold (a raw file's size; a gzip file's size x 1032, deflate's limit) and the memory available;
// `path` must be a regular file (a FIFO, say, is refused rather than waited on), and a file this
// process may not read is "<path>: permission denied".
IdxArray read_idx(const std::string& path, const IdxReadLimits& limits = {});

// Writes an unsigned-byte IDX file (gzip-compressed when `gzip`). data.size() must equal the
// product of dims. Any dims (even ones read_idx rejects) are written, so tests can make bad files.
void write_idx(const std::string& path, std::span<const int64_t> dims, std::span<const uint8_t> data, bool gzip);

// Writes `bytes` as they are, gzip-compressed when `gzip` (tests use it for malformed files).
void write_bytes(const std::string& path, std::span<const uint8_t> bytes, bool gzip);

}  // namespace dtrain
