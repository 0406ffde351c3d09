// The lock of a checkpoint directory: one job per directory (Note [One job per directory] in
// checkpoint_layout.h). Taken without waiting: a second job fails at once naming the holder.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "core/error.h"

namespace dtrain::checkpoint {

// Another live process holds the directory's lock.
class DirectoryInUse : public Error {
 public:
  using Error::Error;
};

// What DIR/dtrain.lock holds: "<pid> <host> <since>\n".
std::string lock_record(long pid, std::string_view host, std::string_view since);
// A lock file's content for an error line: "pid 1234 on vm, since 2026-11-25 09:30:01 UTC".
std::string describe_holder(std::string_view record);

class DirectoryLock {
 public:
  // Creates `dir` when missing and takes DIR/dtrain.lock, recording this process in it; then
  // removes the `.tmp-*` entries dead writers left (no live job can own them now). Throws
  // DirectoryInUse "<dir> is in use by another dtrain job (pid 1234 on vm, since ...)" when another
  // process holds it. A lock file that cannot be opened for writing is locked read-only; a
  // directory where none exists and none can be created (read-only) is not locked: no job can
  // write there either, and the first save reports why.
  explicit DirectoryLock(const std::filesystem::path& dir);
  // Removes the lock file and lets go.
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

  bool held() const { return fd_ >= 0; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

}  // namespace dtrain::checkpoint
