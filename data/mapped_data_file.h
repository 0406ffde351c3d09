// MappedDataFile: a whole data file mapped read-only and shared (the ranks of a node read the same
// page-cache pages), refused unless it is a regular file (Note [Data files are regular files]).
// Used by the formats read in place: llm.c token shards and NumPy arrays.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace dtrain {

class MappedDataFile {
 public:
  // Throws Error (kData), one line naming `path`: permission denied, cannot open (and why), not a
  // regular file, cannot map it. An empty file maps to no bytes.
  explicit MappedDataFile(const std::string& path);
  ~MappedDataFile();
  MappedDataFile(const MappedDataFile&) = delete;
  MappedDataFile& operator=(const MappedDataFile&) = delete;

  // The file's bytes. The file must not shrink while mapped (a read past its new end is SIGBUS).
  std::span<const uint8_t> bytes() const { return {data_, size_}; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace dtrain
