// Durable output for checkpoints: a new file written through a checksum, fsynced before it
// counts as written, and a fault-injection budget that stops the process dead after a given
// number of bytes (so tests can crash a save at any byte). Also directory fsync and the
// whole-file read the checkpoint reader checks sums over.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "checkpoint/safetensors.h"

namespace dtrain::checkpoint {

// "<what> <path>: <strerror(err)>", the one line every I/O failure here reads as.
[[noreturn]] void throw_os_error(std::string_view what, const std::filesystem::path& path, int err);

// The bytes a save may write before the process kills itself with SIGKILL (unlimited when
// empty). One budget spans every file of one save, so a test can stop a save at any byte.
class FaultBudget {
 public:
  explicit FaultBudget(std::optional<uint64_t> limit) : limit_(limit) {}
  // How many of the next n bytes may be written; when fewer than n, the caller writes those
  // and then calls die().
  size_t allow(size_t n);
  [[noreturn]] static void die();

 private:
  std::optional<uint64_t> limit_;
  uint64_t spent_ = 0;
};

// A file created (it must not exist yet) and written through a running CRC-32 (zlib's, the
// IEEE 802.3 polynomial that Python's zlib.crc32 computes). commit() fsyncs and closes it; a
// DurableFile destroyed uncommitted is closed and its file removed.
class DurableFile : public safetensors::ByteSink {
 public:
  DurableFile(std::filesystem::path path, FaultBudget* budget);
  ~DurableFile() override;
  DurableFile(const DurableFile&) = delete;
  DurableFile& operator=(const DurableFile&) = delete;

  void write(std::span<const std::byte> bytes) override;
  void commit();
  uint64_t size() const { return size_; }
  uint32_t crc32() const { return crc_; }

 private:
  std::filesystem::path path_;
  FaultBudget* budget_;
  int fd_ = -1;
  uint64_t size_ = 0;
  uint32_t crc_ = 0;
};

// fsync on a directory, so the entries created or renamed in it survive a power cut.
void fsync_directory(const std::filesystem::path& dir);

// A whole file in memory (for checksumming and then parsing without a second read).
struct FileBytes {
  std::unique_ptr<std::byte[]> data;
  uint64_t size = 0;
};
FileBytes read_whole_file(const std::filesystem::path& path);
uint32_t crc32_of(std::span<const std::byte> bytes);

}  // namespace dtrain::checkpoint
