#include "checkpoint/directory_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <sstream>

#include <fmt/format.h>

#include "checkpoint/checkpoint_layout.h"
#include "checkpoint/durable_file.h"
#include "core/error.h"

namespace dtrain::checkpoint {
namespace fs = std::filesystem;

namespace {

std::string now_utc() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char text[32];
  return std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S UTC", &tm) ? text : "";
}

std::string this_host() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return host[0] ? host : "unknown-host";
}

std::string read_record(int fd) {
  char buf[512];
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

// Best effort: the record only names the holder in another job's error line; a full disk
// must not stop a job that would fail at its first save anyway, with the real reason.
void write_record(int fd) {
  const std::string record = lock_record(static_cast<long>(::getpid()), this_host(), now_utc());
  if (::ftruncate(fd, 0) == 0 && ::pwrite(fd, record.data(), record.size(), 0) == ssize_t(record.size()))
    (void)::fsync(fd);
}

// What a crashed save or deletion left (".tmp-*"): the lock holder alone may remove them.
void remove_leftovers(const fs::path& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().filename().string().starts_with(kTempPrefix)) fs::remove_all(entry.path(), ec);
}

bool same_file(int fd, const fs::path& path) {
  struct stat held {}, named {};
  return ::fstat(fd, &held) == 0 && ::stat(path.c_str(), &named) == 0 && held.st_dev == named.st_dev &&
         held.st_ino == named.st_ino;
}

}  // namespace

std::string lock_record(long pid, std::string_view host, std::string_view since) {
  return fmt::format("{} {} {}\n", pid, host, since);
}

std::string describe_holder(std::string_view record) {
  std::istringstream in{std::string(record)};
  long pid = 0;
  std::string host, since;
  if (!(in >> pid >> host) || pid <= 0) return "its holder has not recorded itself yet";
  std::getline(in >> std::ws, since);
  return since.empty() ? fmt::format("pid {} on {}", pid, host) : fmt::format("pid {} on {}, since {}", pid, host, since);
}

DirectoryLock::DirectoryLock(const fs::path& dir) : path_(dir / kLockFile) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw_os_error("cannot create directory", dir, ec.value());
  // The holder before us removes the file as it lets go: a lock taken on a file that is no
  // longer at the name protects nothing, so take the one that is (a few rounds at most).
  for (int attempt = 0; attempt < 100; ++attempt) {
    int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    const bool writable = fd >= 0;
    if (fd < 0 && (errno == EROFS || errno == EACCES || errno == EPERM)) {
      fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);  // an existing file locks all the same
      if (fd < 0) return;  // none, and none can be made: unwritable, see the header
    }
    if (fd < 0) throw_os_error("cannot open", path_, errno);
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      const std::string record = read_record(fd);
      ::close(fd);
      if (err == EWOULDBLOCK)
        throw DirectoryInUse(fmt::format("{} is in use by another dtrain job ({})", dir.string(), describe_holder(record)));
      throw_os_error("cannot lock", path_, err);
    }
    if (same_file(fd, path_)) {
      fd_ = fd;
      if (writable) write_record(fd_);
      remove_leftovers(dir);
      return;
    }
    ::close(fd);
  }
  throw Error(fmt::format("cannot lock {}: it keeps being replaced", path_.string()));
}

DirectoryLock::~DirectoryLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while still held: nobody can have locked this file meanwhile
  ::close(fd_);
}

}  // namespace dtrain::checkpoint
