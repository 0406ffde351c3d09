// llm.c token shards: opening (map, check every header and token once), reading token ranges as
// int32, and writing shards atomically.
#include "data/token_shards.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"
#include "core/temp_files.h"
#include "data/mapped_data_file.h"

namespace dtrain {

// The header and the tokens are read in place; a big-endian host would need a byte swap on every
// read (llm.c does not support one either).
static_assert(std::endian::native == std::endian::little, "llm.c token shards are little-endian: not supported here");

namespace {

[[noreturn]] void bad_data(const std::string& message) { throw Error(message, ErrorKind::kData); }

// The first position in `tokens` of an id >= limit (tokens.size() when none).
template <class T>
size_t first_at_or_above(std::span<const T> tokens, uint64_t limit) {
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] >= limit) return i;
  return tokens.size();
}

template <class T>
int64_t largest_of(std::span<const T> tokens) {
  T m = 0;
  for (T t : tokens) m = std::max(m, t);  // a plain max: vectorised, ~10 GB/s on one core
  return tokens.empty() ? -1 : static_cast<int64_t>(m);
}

}  // namespace

int64_t shard_vocabulary(int64_t largest_token, int64_t given) {
  if (given > 0) return given;
  if (largest_token < 256) return 256;
  if (largest_token < 50257) return 50257;
  return largest_token + 1;
}

// One mapped shard file (data/mapped_data_file.h: read-only and shared, so ranks on one node
// read the same pages).
struct TokenStream::Shard {
  std::string path;
  std::unique_ptr<MappedDataFile> file;
  int width = 2;  // bytes per token
  int64_t count = 0;

  const uint8_t* tokens() const { return file->bytes().data() + kShardHeaderBytes; }
  template <class T>
  std::span<const T> as() const {
    return {reinterpret_cast<const T*>(tokens()), static_cast<size_t>(count)};
  }
};

TokenStream::TokenStream() = default;
TokenStream::TokenStream(TokenStream&&) noexcept = default;
TokenStream& TokenStream::operator=(TokenStream&&) noexcept = default;
TokenStream::~TokenStream() = default;

namespace {

// Maps `path` after checking its header against its size; the tokens are checked by the caller.
std::unique_ptr<TokenStream::Shard> map_shard(const std::string& path) {
  auto shard = std::make_unique<TokenStream::Shard>();
  shard->path = path;
  shard->file = std::make_unique<MappedDataFile>(path);
  const std::span<const uint8_t> bytes = shard->file->bytes();
  const auto file_bytes = static_cast<int64_t>(bytes.size());
  if (file_bytes < kShardHeaderBytes)
    bad_data(fmt::format("{}: {} bytes, shorter than the {}-byte header of an llm.c token shard", path, file_bytes,
                         kShardHeaderBytes));
  int32_t header[3] = {0, 0, 0};
  std::memcpy(header, bytes.data(), sizeof header);
  const int32_t magic = header[0], version = header[1], count = header[2];
  if (magic == kShardMagicU16) {
    shard->width = 2;
    if (version != 1)
      bad_data(fmt::format("{}: version {} for magic {} (an llm.c shard of uint16 tokens has version 1)", path,
                           version, magic));
  } else if (magic == kShardMagicU32) {
    shard->width = 4;
    if (version != 7)
      bad_data(fmt::format("{}: version {} for magic {} (an llm.c shard of uint32 tokens has version 7)", path,
                           version, magic));
  } else {
    bad_data(fmt::format("{}: not an llm.c token shard (magic {}, expected {} or {})", path, magic, kShardMagicU16,
                         kShardMagicU32));
  }
  if (count < 0) bad_data(fmt::format("{}: the header's token count is negative ({})", path, count));
  shard->count = count;
  const int64_t body = file_bytes - kShardHeaderBytes;
  if (body != int64_t{count} * shard->width)
    bad_data(fmt::format("{}: the header says {} tokens ({} bytes), the file holds {} bytes after its header", path,
                         count, int64_t{count} * shard->width, body));
  return shard;
}

// Checks every token of `shard` once: below `vocab` when given, and within int32 (dtrain's token
// ids); returns the largest.
int64_t check_tokens(const TokenStream::Shard& shard, int64_t vocab) {
  const int64_t largest = shard.width == 2 ? largest_of(shard.as<uint16_t>()) : largest_of(shard.as<uint32_t>());
  const int64_t limit = vocab > 0 ? vocab : int64_t{INT32_MAX};
  if (largest < limit) return largest;
  const size_t at = shard.width == 2 ? first_at_or_above(shard.as<uint16_t>(), static_cast<uint64_t>(limit))
                                     : first_at_or_above(shard.as<uint32_t>(), static_cast<uint64_t>(limit));
  const int64_t token = shard.width == 2 ? shard.as<uint16_t>()[at] : shard.as<uint32_t>()[at];
  if (vocab > 0)
    bad_data(fmt::format("{}: token {} (id {}) is not below the vocabulary size {}", shard.path, at, token, vocab));
  bad_data(fmt::format("{}: token {} (id {}) does not fit the int32 token ids dtrain uses", shard.path, at, token));
}

}  // namespace

TokenStream TokenStream::open(const std::vector<std::string>& paths, int64_t vocab) {
  TokenStream s;
  for (const std::string& path : paths) {
    std::unique_ptr<Shard> shard = map_shard(path);
    s.largest_ = std::max(s.largest_, check_tokens(*shard, vocab));
    s.starts_.push_back(s.size_);
    s.size_ += shard->count;
    s.files_.push_back(path);
    s.shards_.push_back(std::move(shard));
  }
  return s;
}

void TokenStream::copy(int64_t begin, std::span<int32_t> out) const {
  const auto n = static_cast<int64_t>(out.size());
  DTRAIN_CHECK(begin >= 0 && n >= 0 && begin <= size_ - n, "tokens [{}, {}) of a stream of {}", begin, begin + n,
               size_);
  // The shard holding `begin`: the last one starting at or before it (empty shards share a start).
  size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), begin) - starts_.begin()) - 1;
  int64_t done = 0;
  while (done < n) {
    const Shard& sh = *shards_[i];
    const int64_t from = begin + done - starts_[i];
    const int64_t take = std::min(n - done, sh.count - from);
    int32_t* dst = out.data() + done;
    if (sh.width == 2) {
      const auto src = sh.as<uint16_t>().subspan(static_cast<size_t>(from), static_cast<size_t>(take));
      std::copy(src.begin(), src.end(), dst);
    } else {
      const auto src = sh.as<uint32_t>().subspan(static_cast<size_t>(from), static_cast<size_t>(take));
      for (size_t k = 0; k < src.size(); ++k) dst[k] = static_cast<int32_t>(src[k]);  // checked < INT32_MAX at open
    }
    done += take;
    ++i;
  }
}

std::vector<std::string> shard_files(const std::string& dir, const std::string& split) {
  namespace fs = std::filesystem;
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.starts_with(".") || !name.ends_with(".bin")) continue;
    if (name.substr(0, name.size() - 4).find(split) == std::string::npos) continue;
    names.push_back(name);
  }
  if (ec) bad_data(fmt::format("{}: cannot list the data directory: {}", dir, ec.message()));
  std::sort(names.begin(), names.end());  // bytewise: Python's sorted() order for UTF-8 names
  std::vector<std::string> out;
  for (const std::string& name : names) out.push_back((fs::path(dir) / name).string());
  return out;
}

namespace {

// "DIR/a.bin" or "DIR/a.bin ... DIR/z.bin (3 files)": the files of a split, in one line.
std::string files_text(const std::vector<std::string>& files) {
  if (files.size() == 1) return files[0];
  return fmt::format("{} ... {} ({} files)", files.front(), files.back(), files.size());
}

TokenStream open_split(const std::string& dir, const std::string& split, const char* what, int64_t vocab,
                       int64_t sequence_tokens) {
  const std::vector<std::string> files = shard_files(dir, split);
  if (files.empty()) bad_data(fmt::format("{}: no {} shards (*{}*.bin)", dir, what, split));
  TokenStream s = TokenStream::open(files, vocab);
  if (s.size() < sequence_tokens + 1)
    bad_data(fmt::format("{}: {} tokens, fewer than one batch of {} tokens (batch size x context) and its next token ({})",
                         files_text(files), s.size(), sequence_tokens, sequence_tokens + 1));
  return s;
}

}  // namespace

TokenShards open_token_shards(const std::string& dir, int64_t vocab, int64_t sequence_tokens) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) bad_data(fmt::format("{}: data directory not found", dir));
  // A name matching both globs ("medieval_train.bin": *val*) would be trained on and validated on.
  for (const std::string& path : shard_files(dir, "train")) {
    const std::string name = std::filesystem::path(path).stem().string();
    if (name.find("val") != std::string::npos)
      bad_data(fmt::format("{}: the name matches both *train*.bin and *val*.bin: rename it to hold one", path));
  }
  TokenStream train = open_split(dir, "train", "training", vocab, sequence_tokens);
  TokenStream val = open_split(dir, "val", "validation", vocab, sequence_tokens);
  const int64_t v = shard_vocabulary(std::max(train.largest_token(), val.largest_token()), vocab);
  return {std::move(train), std::move(val), v};
}

namespace {

// Writes a shard of `count` tokens through a temporary beside `path`; fill(dst, begin, n) puts
// tokens [begin, begin + n) into dst as `width`-byte little-endian ids.
template <class Fill>
void write_shard(const std::string& path, int64_t count, bool wide, Fill fill) {
  auto fail = [&](const std::string& what, int err) {
    throw Error(fmt::format("{}: cannot write: {}{}", path, what, std::strerror(err)), ErrorKind::kOutput);
  };
  DTRAIN_CHECK(count <= INT32_MAX, "{} tokens do not fit one shard", count);
  remove_stale_temporaries(path);  // a killed writer's, never a live one's
  const std::string tmp = temporary_path(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("", errno);
  auto write_all = [&](const void* data, size_t bytes) {
    const auto* p = static_cast<const uint8_t*>(data);
    while (bytes > 0) {
      const ssize_t w = ::write(fd, p, bytes);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const int err = w < 0 ? errno : ENOSPC;
        ::close(fd);
        ::unlink(tmp.c_str());
        fail("", err);
      }
      p += w;
      bytes -= static_cast<size_t>(w);
    }
  };
  std::vector<int32_t> header(256, 0);
  header[0] = wide ? kShardMagicU32 : kShardMagicU16;
  header[1] = wide ? 7 : 1;
  header[2] = static_cast<int32_t>(count);
  write_all(header.data(), header.size() * sizeof(int32_t));
  std::vector<uint8_t> chunk;
  const int width = wide ? 4 : 2;
  constexpr int64_t kChunk = 1 << 20;
  for (int64_t at = 0; at < count; at += kChunk) {
    const int64_t n = std::min(kChunk, count - at);
    chunk.resize(static_cast<size_t>(n * width));
    fill(chunk.data(), at, n);
    write_all(chunk.data(), chunk.size());
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    fail("", err);
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail("", err);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail(fmt::format("cannot rename {} over it: ", tmp), err);
  }
}

}  // namespace

void write_token_shard(const std::string& path, std::span<const uint32_t> tokens, bool wide) {
  if (!wide)
    if (const size_t at = first_at_or_above(tokens, 65536); at < tokens.size())
      throw Error(fmt::format("{}: token {} (id {}) does not fit a shard of uint16 tokens", path, at, tokens[at]),
                  ErrorKind::kUsage);
  write_shard(path, static_cast<int64_t>(tokens.size()), wide, [&](uint8_t* dst, int64_t begin, int64_t n) {
    for (int64_t k = 0; k < n; ++k) {
      const uint32_t t = tokens[static_cast<size_t>(begin + k)];
      if (wide) {
        std::memcpy(dst + 4 * k, &t, 4);
      } else {
        const auto t16 = static_cast<uint16_t>(t);
        std::memcpy(dst + 2 * k, &t16, 2);
      }
    }
  });
}

void write_token_shard(const std::string& path, std::span<const uint8_t> bytes) {
  write_shard(path, static_cast<int64_t>(bytes.size()), false, [&](uint8_t* dst, int64_t begin, int64_t n) {
    for (int64_t k = 0; k < n; ++k) {
      dst[2 * k] = bytes[static_cast<size_t>(begin + k)];  // little-endian uint16: the byte, then 0
      dst[2 * k + 1] = 0;
    }
  });
}

}  // namespace dtrain
