#include "checkpoint/durable_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain::checkpoint {

void throw_os_error(std::string_view what, const std::filesystem::path& path, int err) {
  throw Error(fmt::format("{} {}: {}", what, path.string(), std::strerror(err)));
}

size_t FaultBudget::allow(size_t n) {
  if (!limit_) return n;
  const uint64_t left = *limit_ > spent_ ? *limit_ - spent_ : 0;
  const size_t allowed = static_cast<size_t>(std::min<uint64_t>(n, left));
  spent_ += allowed;
  return allowed;
}

void FaultBudget::die() {
  // As a SIGKILL from outside would: no destructors, no flush, no cleanup.
  ::raise(SIGKILL);
  ::_exit(137);
}

DurableFile::DurableFile(std::filesystem::path path, FaultBudget* budget) : path_(std::move(path)), budget_(budget) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_os_error("cannot create", path_, errno);
  crc_ = static_cast<uint32_t>(::crc32_z(0, nullptr, 0));
}

DurableFile::~DurableFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(path_.c_str());
}

void DurableFile::write(std::span<const std::byte> bytes) {
  const size_t allowed = budget_ ? budget_->allow(bytes.size()) : bytes.size();
  auto rest = bytes.first(allowed);
  crc_ = static_cast<uint32_t>(::crc32_z(crc_, reinterpret_cast<const Bytef*>(rest.data()), rest.size()));
  while (!rest.empty()) {
    ssize_t n = ::write(fd_, rest.data(), std::min<size_t>(rest.size(), size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_os_error("cannot write", path_, errno);
    rest = rest.subspan(static_cast<size_t>(n));
    size_ += static_cast<uint64_t>(n);
  }
  if (allowed < bytes.size()) FaultBudget::die();
}

void DurableFile::commit() {
  if (::fsync(fd_) != 0) throw_os_error("cannot write", path_, errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(path_.c_str());
    throw_os_error("cannot write", path_, err);
  }
}

void fsync_directory(const std::filesystem::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_os_error("cannot open directory", dir, errno);
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    throw_os_error("cannot sync directory", dir, err);
  }
  ::close(fd);
}

FileBytes read_whole_file(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_os_error("cannot open", path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(fmt::format("{}: not a regular file", path.string()));
  }
  FileBytes file{std::make_unique_for_overwrite<std::byte[]>(static_cast<size_t>(st.st_size)),
                 static_cast<uint64_t>(st.st_size)};
  uint64_t got = 0;
  while (got < file.size) {
    ssize_t n = ::read(fd, file.data.get() + got, std::min<uint64_t>(file.size - got, uint64_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      if (n == 0) throw Error(fmt::format("{}: file shrank while being read", path.string()));
      throw_os_error("cannot read", path, err);
    }
    got += static_cast<uint64_t>(n);
  }
  ::close(fd);
  return file;
}

uint32_t crc32_of(std::span<const std::byte> bytes) {
  return static_cast<uint32_t>(
      ::crc32_z(::crc32_z(0, nullptr, 0), reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
}

}  // namespace dtrain::checkpoint
