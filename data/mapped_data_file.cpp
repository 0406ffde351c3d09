// MappedDataFile: open without blocking, check, map, close the descriptor (the mapping stays).
#include "data/mapped_data_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain {

MappedDataFile::MappedDataFile(const std::string& path) {
  const auto bad = [](const std::string& message) { throw Error(message, ErrorKind::kData); };
  // O_NONBLOCK: a FIFO is refused below, not waited on (Note [Data files are regular files]).
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0 && errno == EACCES) bad(fmt::format("{}: permission denied", path));
  if (fd < 0) bad(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) bad(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) bad(fmt::format("{}: not a regular file", path));
  size_ = static_cast<size_t>(st.st_size);
  if (size_ == 0) return;  // mmap refuses length 0; the readers say the file is too short
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) bad(fmt::format("{}: cannot map it: {}", path, std::strerror(errno)));
  data_ = static_cast<const uint8_t*>(p);
}

MappedDataFile::~MappedDataFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace dtrain
