#include "app/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "core/temp_files.h"

namespace dtrain {

void write_file_atomically(const std::string& path, const std::string& text) {
  remove_stale_temporaries(path);  // a killed writer's, never a live one's
  const std::string tmp = temporary_path(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(fmt::format("{}: cannot create: {}", tmp, std::strerror(errno)));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error(fmt::format("{}: cannot write: {}", tmp, std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(fmt::format("{}: cannot write: {}", tmp, std::strerror(err)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(fmt::format("cannot rename {} to {}: {}", tmp, path, std::strerror(err)));
  }
}

namespace {

[[noreturn]] void cannot_write(const std::string& flag, const std::string& path, const std::string& reason) {
  throw Error(fmt::format("{}: {}: cannot write there: {}", flag, path, reason), ErrorKind::kOutput);
}

// Creates and removes a probe file in `dir`; the OS error when that fails, "" when it works.
std::string probe_dir(const std::string& dir) {
  const std::string probe = (std::filesystem::path(dir.empty() ? "." : dir) /
                             fmt::format(".dtrain-write-test.{}", getpid())).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return std::strerror(errno);
  ::close(fd);
  ::unlink(probe.c_str());
  return "";
}

}  // namespace

void check_writable_dir(const std::string& flag, const std::string& dir, bool create) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (create && !fs::exists(dir, ec) && !ec) fs::create_directories(dir, ec);
  if (ec) cannot_write(flag, dir, ec.message());
  if (!fs::is_directory(dir, ec)) cannot_write(flag, dir, ec ? ec.message() : "not a directory");
  if (const std::string err = probe_dir(dir); !err.empty()) cannot_write(flag, dir, err);
}

void check_writable_file(const std::string& flag, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) cannot_write(flag, path, "is a directory");
  if (fs::exists(path, ec)) {
    // A FIFO would block this open until a reader came (and a device is no trace file).
    if (!fs::is_regular_file(path, ec)) cannot_write(flag, path, "not a regular file");
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);  // no O_TRUNC: the file stays as it is
    if (fd < 0) cannot_write(flag, path, std::strerror(errno));
    ::close(fd);
    return;
  }
  const fs::path parent = fs::path(path).parent_path();
  if (const std::string err = probe_dir(parent.string()); !err.empty()) cannot_write(flag, path, err);
}

}  // namespace dtrain
