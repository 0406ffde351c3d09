// IDX reading and writing. The whole payload is read into memory; the size the header
// promises is checked against what the file holds, so a cut download fails here, by name,
// rather than as garbage pixels later.
#include "data/idx_reader.h"

#include <libdeflate.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"
#include "core/memory.h"

namespace dtrain {
namespace {

// One byte source over either a gzip stream or a plain file.
class Source {
 public:
  virtual ~Source() = default;
  // Reads up to n bytes; returns how many were read (0 at the end). Throws on a read error.
  virtual size_t read(void* dst, size_t n) = 0;
  // Why the stream ended early, if the format knows (gzip: "unexpected end of file").
  virtual std::string early_end_reason() const { return ""; }
  // The most bytes this source can hold: a header that promises more fails on reading, and the
  // buffer is never sized beyond what can arrive.
  virtual size_t max_bytes() const { return SIZE_MAX; }
  // Everything not yet read, handed over without a copy, when the source holds it in memory.
  virtual std::optional<std::vector<uint8_t>> take_rest() { return std::nullopt; }
};

// The size of `f`'s file (SIZE_MAX when unknown, e.g. a pipe).
size_t file_size(std::FILE* f) {
  struct stat st {};
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) return SIZE_MAX;
  return static_cast<size_t>(st.st_size);
}

// Deflate expands at most 1032:1, so a gzip file of n bytes holds at most this many.
size_t gzip_max_bytes(size_t compressed) {
  return compressed > SIZE_MAX / 1032 - 1 ? SIZE_MAX : compressed * 1032 + 1024;
}

class FileSource : public Source {
 public:
  FileSource(std::FILE* f, const std::string& path) : f_(f), path_(path), size_(file_size(f)) {}
  ~FileSource() override { std::fclose(f_); }
  size_t read(void* dst, size_t n) override {
    size_t got = std::fread(dst, 1, n, f_);
    if (got < n && std::ferror(f_)) throw Error(fmt::format("{}: read error: {}", path_, std::strerror(errno)));
    return got;
  }
  size_t max_bytes() const override { return size_; }

 private:
  std::FILE* f_;
  std::string path_;
  size_t size_;
};

// Bytes already in memory: a gzip file libdeflate decompressed whole.
class MemorySource : public Source {
 public:
  explicit MemorySource(std::vector<uint8_t> bytes) : bytes_(std::move(bytes)) {}
  size_t read(void* dst, size_t n) override {
    const size_t got = std::min(n, bytes_.size() - at_);
    if (got > 0) std::memcpy(dst, bytes_.data() + at_, got);
    at_ += got;
    return got;
  }
  size_t max_bytes() const override { return bytes_.size(); }
  // The header is a few bytes: moving the payload down keeps the pages the decoder filled.
  std::optional<std::vector<uint8_t>> take_rest() override {
    bytes_.erase(bytes_.begin(), bytes_.begin() + static_cast<std::ptrdiff_t>(at_));
    at_ = 0;
    return std::exchange(bytes_, {});
  }

 private:
  std::vector<uint8_t> bytes_;
  size_t at_ = 0;
};

// A read-only, pre-faulted mapping of a whole file (unmapped on destruction).
class MappedFile {
 public:
  MappedFile(std::FILE* f, size_t size) : size_(size) {
    void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fileno(f), 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<const uint8_t*>(p);
  }
  ~MappedFile() {
    if (data_) munmap(const_cast<uint8_t*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_;
};

// gzerror()'s message, less the "<path>: " or "<fd:N>: " zlib puts in front (our errors name the
// file already).
std::string gz_message(gzFile f, const std::string& path, int* errnum) {
  std::string msg = gzerror(f, errnum);
  if (msg.starts_with(path + ": ")) msg.erase(0, path.size() + 2);
  if (const size_t end = msg.find(">: "); msg.starts_with("<fd:") && end != std::string::npos) msg.erase(0, end + 3);
  return msg;
}

class GzipSource : public Source {
 public:
  GzipSource(gzFile f, const std::string& path, size_t compressed)
      : f_(f), path_(path), max_bytes_(gzip_max_bytes(compressed)) {
    gzbuffer(f_, 1 << 18);  // large reads: the image file is ~26 MB compressed
  }
  ~GzipSource() override { gzclose(f_); }
  size_t read(void* dst, size_t n) override {
    size_t total = 0;
    auto* out = static_cast<char*>(dst);
    while (total < n && !ended_) {
      unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - total, 1u << 30));
      int got = gzread(f_, out + total, chunk);
      if (got < 0) {
        int errnum = 0;
        std::string msg = gz_message(f_, path_, &errnum);
        // A cut-off stream is a truncated file, reported by the caller with the sizes.
        if (errnum == Z_BUF_ERROR) {
          reason_ = msg;
          ended_ = true;
          break;
        }
        if (errnum == Z_ERRNO) throw Error(fmt::format("{}: read error: {}", path_, std::strerror(errno)));
        throw Error(fmt::format("{}: corrupt gzip data: {}", path_, msg));
      }
      if (got == 0) {
        ended_ = true;
        int errnum = 0;
        std::string msg = gz_message(f_, path_, &errnum);
        if (errnum == Z_BUF_ERROR) reason_ = msg;
        break;
      }
      total += static_cast<size_t>(got);
    }
    return total;
  }
  std::string early_end_reason() const override { return reason_.empty() ? "" : "gzip: " + reason_; }
  size_t max_bytes() const override { return max_bytes_; }

 private:
  gzFile f_;
  std::string path_;
  size_t max_bytes_;
  bool ended_ = false;
  std::string reason_;
};

const char* type_name(uint8_t code) {
  switch (code) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "int16";
    case 0x0C: return "int32";
    case 0x0D: return "float32";
    case 0x0E: return "float64";
    default: return "unknown";
  }
}

const char* payload_name(size_t ndim) {
  if (ndim == 1) return "label data";
  if (ndim == 3) return "image data";
  return "data";
}

// Largest payload accepted (1 TiB): a header beyond this is corrupt, not a real data set.
constexpr int64_t kMaxPayload = int64_t{1} << 40;

std::string truncated_message(const std::string& path, size_t expected, const char* what, size_t have,
                              const std::string& reason) {
  return fmt::format("{}: truncated: expected {} bytes of {}, got {}{}", path, expected, what, have,
                     reason.empty() ? "" : " (" + reason + ")");
}

std::string trailing_message(const std::string& path, size_t trailing, size_t expected, const char* what) {
  return fmt::format("{}: {} bytes of trailing data after the {} bytes of {} the header describes", path, trailing,
                     expected, what);
}

// Reads exactly n bytes or throws "truncated: expected <n> bytes of <what>, got <m>".
void read_exact(Source& src, const std::string& path, void* dst, size_t n, const char* what) {
  size_t got = src.read(dst, n);
  if (got != n) throw Error(truncated_message(path, n, what, got, src.early_end_reason()));
}

// What an IDX header says: the dimensions and the payload they make.
struct IdxHeader {
  std::vector<int64_t> dims;
  size_t header_bytes = 0;   // 4 + 4 per dimension
  size_t payload_bytes = 0;  // the product of dims
  const char* what = "data";
};

// Reads and checks the header at the start of `src`.
IdxHeader read_header(Source& src, const std::string& path) {
  uint8_t header[4];
  read_exact(src, path, header, 4, "IDX header");
  if (header[0] != 0 || header[1] != 0)
    throw Error(fmt::format("{}: not an IDX file (magic {:02x} {:02x} {:02x} {:02x}, expected 00 00 08 <ndim>)", path,
                            header[0], header[1], header[2], header[3]));
  if (header[2] != 0x08)
    throw Error(fmt::format("{}: unsupported IDX element type 0x{:02x} ({}); only unsigned byte (0x08) is supported",
                            path, header[2], type_name(header[2])));
  size_t ndim = header[3];
  if (ndim < 1 || ndim > 4) throw Error(fmt::format("{}: unsupported IDX rank {} (expected 1 to 4)", path, ndim));

  uint8_t raw_dims[16];
  read_exact(src, path, raw_dims, 4 * ndim, "IDX dimensions");
  IdxHeader out;
  int64_t total = 1;
  for (size_t i = 0; i < ndim; ++i) {
    const uint8_t* p = raw_dims + 4 * i;
    int64_t d = (int64_t{p[0]} << 24) | (int64_t{p[1]} << 16) | (int64_t{p[2]} << 8) | int64_t{p[3]};
    if (d == 0) throw Error(fmt::format("{}: dimension {} of the IDX header is zero", path, i));
    if (total > kMaxPayload / d) throw Error(fmt::format("{}: IDX header dimensions are implausibly large", path));
    total *= d;
    out.dims.push_back(d);
  }
  out.header_bytes = 4 + 4 * ndim;
  out.payload_bytes = static_cast<size_t>(total);
  out.what = payload_name(ndim);
  return out;
}

// The first "<key>: <n> kB" figure of /proc/meminfo, in bytes; SIZE_MAX when absent.
size_t meminfo_bytes(const char* key) {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return SIZE_MAX;
  char line[256];
  size_t out = SIZE_MAX;
  const size_t key_len = std::strlen(key);
  while (std::fgets(line, sizeof line, f)) {
    unsigned long long kb = 0;
    if (std::strncmp(line, key, key_len) == 0 && line[key_len] == ':' &&
        std::sscanf(line + key_len + 1, "%llu", &kb) == 1) {
      out = static_cast<size_t>(kb) * 1024;
      break;
    }
  }
  std::fclose(f);
  return out;
}

// One number in a file (a cgroup's memory.max and the like); SIZE_MAX when absent or "max".
size_t number_in_file(const char* path) {
  std::FILE* f = std::fopen(path, "r");
  if (!f) return SIZE_MAX;
  unsigned long long v = 0;
  const bool ok = std::fscanf(f, "%llu", &v) == 1;
  std::fclose(f);
  return ok ? static_cast<size_t>(v) : SIZE_MAX;
}

// Memory a new allocation can take: the kernel's MemAvailable, or less when this process's cgroup
// (v2, or v1's memory controller) has a limit closer to its usage.
MemoryAvailable memory_available_now() {
  MemoryAvailable m{meminfo_bytes("MemAvailable"), "MemAvailable"};
  const std::pair<const char*, const char*> cgroups[] = {
      {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
      {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"}};
  for (const auto& [limit_path, usage_path] : cgroups) {
    const size_t limit = number_in_file(limit_path), usage = number_in_file(usage_path);
    if (limit == SIZE_MAX || usage == SIZE_MAX) continue;
    const size_t left = limit > usage ? limit - usage : 0;
    if (left < m.bytes) m = {left, "the cgroup's memory limit"};
    break;
  }
  return m;
}

// Note [Bounded decompression]
// A header is believed only as far as the file can back it and memory can hold it, both checked
// before the payload's buffer exists: a raw file must be as large as it declares, a gzip file
// cannot inflate beyond deflate's 1032:1, and no payload may exceed the memory available. So a
// 4 MB gzip whose header declares 784 GB fails at once, in one line naming both figures, rather
// than after inflating gigabytes (or meeting the OOM killer).
void check_payload_bounds(const IdxHeader& h, const std::string& path, bool gzip, size_t file_bytes,
                          size_t source_bound, const IdxReadLimits& limits) {
  if (!gzip && h.payload_bytes > source_bound)
    throw Error(truncated_message(path, h.payload_bytes, h.what, source_bound, ""));
  if (gzip && h.payload_bytes > source_bound)
    throw Error(fmt::format("{}: the IDX header declares {} bytes of {}, more than this {}-byte gzip file can hold "
                            "(at most {} bytes: deflate expands at most 1032:1)",
                            path, h.payload_bytes, h.what, file_bytes, source_bound));
  const MemoryAvailable m = limits.memory_available.bytes > 0 ? limits.memory_available : memory_available_now();
  if (h.payload_bytes > m.bytes)
    throw Error(fmt::format("{}: the IDX header declares {} bytes ({}) of {}, more than the {} bytes ({}) of memory "
                            "available ({})",
                            path, h.payload_bytes, format_bytes(double(h.payload_bytes)), h.what, m.bytes,
                            format_bytes(double(m.bytes)), m.source),
                ErrorKind::kResources);
}

// Note [Two gzip decoders]
// libdeflate decompresses the 26 MB training images in about half of zlib's instructions
// (callgrind, the whole read_idx: 0.60 G vs 1.13 G; CPU time 135 vs 230 ms) but only whole
// buffers, into an output whose size it must be told: the gzip trailer's ISIZE (the size mod
// 2^32 of the last member). So a gzip file is mapped whole (pre-faulted) and decoded by
// libdeflate into ISIZE bytes, which then become the payload without a copy (a copy would cost
// 11,500 page faults, as much as the decoder saves); that succeeds only for a well-formed
// single-member file whose trailer is true, agrees with the IDX header (`total`, the header and
// payload bytes; Note [Bounded decompression]) and whose every byte was consumed. Anything else
// (corruption, truncation, several members, trailing bytes, ISIZE beyond the deflate bound)
// falls back to zlib's stream, whose errors and semantics the reader has always had. The header
// checks run on either source and the payload checks share their messages, so every message is
// the same whichever decoder ran.
std::optional<std::vector<uint8_t>> decompress_whole(std::FILE* f, size_t size, size_t total) {
  if (size < 18 || size == SIZE_MAX) return std::nullopt;  // 18: the smallest gzip member
  const MappedFile in(f, size);
  if (!in.data()) return std::nullopt;
  const uint8_t* t = in.data() + size - 4;
  const size_t isize = uint32_t{t[0]} | uint32_t{t[1]} << 8 | uint32_t{t[2]} << 16 | uint32_t{t[3]} << 24;
  if (isize == 0 || isize > gzip_max_bytes(size) || isize != total) return std::nullopt;
  std::vector<uint8_t> out(isize);
  std::unique_ptr<libdeflate_decompressor, decltype(&libdeflate_free_decompressor)> d(
      libdeflate_alloc_decompressor(), &libdeflate_free_decompressor);
  if (!d) return std::nullopt;
  size_t used = 0, produced = 0;
  if (libdeflate_gzip_decompress_ex(d.get(), in.data(), size, out.data(), isize, &used, &produced) !=
          LIBDEFLATE_SUCCESS ||
      used != size || produced != isize)
    return std::nullopt;
  return out;
}

// "a FIFO", "a directory", ...: what a path that is not a regular file is, for messages.
const char* file_kind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "of an unknown kind";
}

// Note [Data files are regular files]
// A data file is opened without blocking and refused unless it is a regular file: opening a FIFO
// with no writer blocks forever (under the launcher, until --start-timeout blames the network),
// and a pipe can be neither sized (Note [Bounded decompression]) nor mapped nor rewound after
// the gzip probe. Making a stream a file is one command (`cat x > f`); a hang explains nothing.
std::FILE* open_regular_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0 && errno == EACCES) throw Error(fmt::format("{}: permission denied", path));
  if (fd < 0) throw Error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(fmt::format("{}: cannot open: {}", path, std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(fmt::format("{}: not a regular file ({})", path, file_kind(st.st_mode)));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // a regular file's reads never block anyway
  std::FILE* f = ::fdopen(fd, "rb");
  if (!f) {
    const int err = errno;
    ::close(fd);
    throw Error(fmt::format("{}: cannot open: {}", path, std::strerror(err)));
  }
  return f;
}

// A zlib stream over `f`'s file from its start, through a descriptor of its own (never the path
// again: what is read is what was checked).
gzFile gzip_stream(std::FILE* f, const std::string& path) {
  const int fd = ::dup(fileno(f));
  if (fd < 0 || ::lseek(fd, 0, SEEK_SET) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    throw Error(fmt::format("{}: cannot open: {}", path, std::strerror(err)));
  }
  gzFile gz = gzdopen(fd, "rb");
  if (!gz) {
    ::close(fd);
    throw Error(fmt::format("{}: cannot open: out of memory", path), ErrorKind::kResources);
  }
  return gz;
}

std::unique_ptr<Source> open_source(const std::string& path, const IdxReadLimits& limits) {
  std::FILE* f = open_regular_file(path);
  unsigned char magic[2] = {0, 0};
  size_t got = std::fread(magic, 1, 2, f);
  if (got == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
    const size_t size = file_size(f);
    try {
      // The IDX header first, through zlib (a few bytes inflated), so the whole-file decoder
      // allocates nothing a lying header asked for (Note [Bounded decompression]).
      GzipSource peek(gzip_stream(f, path), path, size);
      const IdxHeader h = read_header(peek, path);
      check_payload_bounds(h, path, true, size, peek.max_bytes(), limits);
      std::optional<std::vector<uint8_t>> whole = decompress_whole(f, size, h.header_bytes + h.payload_bytes);
      // Each source is made before `f` is closed, so that a failure (out of memory) leaves
      // `f` open for the handler below to close, once.
      std::unique_ptr<Source> source;
      if (whole)
        source = std::make_unique<MemorySource>(std::move(*whole));
      else
        source = std::make_unique<GzipSource>(gzip_stream(f, path), path, size);
      std::fclose(f);
      return source;
    } catch (...) {
      std::fclose(f);
      throw;
    }
  }
  std::rewind(f);
  auto source = std::make_unique<FileSource>(f, path);
  const IdxHeader h = read_header(*source, path);
  check_payload_bounds(h, path, false, source->max_bytes(), source->max_bytes() - h.header_bytes, limits);
  std::rewind(f);
  return source;
}

// The payload of an in-memory source: `rest`, checked as the streaming read checks it.
IdxArray take_payload(IdxArray out, std::vector<uint8_t> rest, const std::string& path, size_t expected,
                      const char* what) {
  if (rest.size() < expected) throw Error(truncated_message(path, expected, what, rest.size(), ""));
  if (rest.size() > expected) throw Error(trailing_message(path, rest.size() - expected, expected, what));
  out.data = std::move(rest);
  return out;
}

IdxArray read_idx_bounded(const std::string& path, const IdxReadLimits& limits) {
  std::unique_ptr<Source> src = open_source(path, limits);
  const IdxHeader h = read_header(*src, path);
  IdxArray out;
  out.dims = h.dims;
  const size_t expected = h.payload_bytes;
  const char* what = h.what;
  if (std::optional<std::vector<uint8_t>> rest = src->take_rest())
    return take_payload(std::move(out), std::move(*rest), path, expected, what);
  // Grow while reading (a zlib stream's true length is known only at its end), after the bounds
  // open_source checked.
  size_t have = 0;
  out.data.resize(std::min({expected, src->max_bytes(), size_t{64} << 20}));
  while (true) {
    size_t got = src->read(out.data.data() + have, out.data.size() - have);
    have += got;
    if (have == expected) break;
    if (have < out.data.size() || out.data.size() == src->max_bytes())
      throw Error(truncated_message(path, expected, what, have, src->early_end_reason()));
    out.data.resize(std::min({expected, out.data.size() * 2, src->max_bytes()}));
  }
  uint8_t extra[4096];
  size_t trailing = 0;
  for (size_t got; (got = src->read(extra, sizeof extra)) > 0;) trailing += got;
  if (trailing > 0) throw Error(trailing_message(path, trailing, expected, what));
  // A gzip stream cut after the payload (in its checksum, say) delivered every byte the header
  // promised, yet none of them can be trusted: the CRC that would vouch for them is missing.
  if (std::string reason = src->early_end_reason(); !reason.empty())
    throw Error(fmt::format("{}: truncated: the {} bytes of {} arrived but the file ends early ({})", path, expected,
                            what, reason));
  return out;
}

}  // namespace

IdxArray read_idx(const std::string& path, const IdxReadLimits& limits) {
  try {
    return read_idx_bounded(path, limits);
  } catch (const std::bad_alloc&) {
    // Past the bounds yet still out of memory (other allocations, an address-space limit): the
    // file is named, not a bare std::bad_alloc.
    throw Error(fmt::format("{}: out of memory while reading it", path), ErrorKind::kResources);
  }
}

void write_idx(const std::string& path, std::span<const int64_t> dims, std::span<const uint8_t> data, bool gzip) {
  DTRAIN_CHECK(!dims.empty() && dims.size() <= 255, "IDX rank {} out of range", dims.size());
  int64_t total = 1;
  std::vector<uint8_t> bytes = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  for (int64_t d : dims) {
    DTRAIN_CHECK(d >= 0 && d <= int64_t{UINT32_MAX}, "IDX dimension {} out of range", d);
    total *= d;
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<uint8_t>((d >> shift) & 0xff));
  }
  DTRAIN_CHECK(static_cast<size_t>(total) == data.size(), "{} bytes for IDX dimensions of {} elements", data.size(),
               total);
  bytes.insert(bytes.end(), data.begin(), data.end());
  write_bytes(path, bytes, gzip);
}

void write_bytes(const std::string& path, std::span<const uint8_t> bytes, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    if (!f) throw Error(fmt::format("{}: cannot create: {}", path, std::strerror(errno)));
    size_t done = 0;
    bool ok = true;
    while (ok && done < bytes.size()) {
      unsigned chunk = static_cast<unsigned>(std::min<size_t>(bytes.size() - done, 1u << 30));
      int wrote = gzwrite(f, bytes.data() + done, chunk);
      ok = wrote > 0;
      done += ok ? static_cast<size_t>(wrote) : 0;
    }
    if (gzclose(f) != Z_OK || !ok) throw Error(fmt::format("{}: write failed", path));
    return;
  }
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw Error(fmt::format("{}: cannot create: {}", path, std::strerror(errno)));
  size_t wrote = bytes.empty() ? 0 : std::fwrite(bytes.data(), 1, bytes.size(), f);
  if (std::fclose(f) != 0 || wrote != bytes.size())
    throw Error(fmt::format("{}: write failed: {}", path, std::strerror(errno)));
}

}  // namespace dtrain
