#include "checkpoint/optimizer_shards.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include "checkpoint/checkpoint_layout.h"
#include "checkpoint/durable_file.h"
#include "checkpoint/finite.h"
#include "core/error.h"
#include "core/temp_files.h"

namespace dtrain::checkpoint {
namespace fs = std::filesystem;
using nlohmann::json;

std::string optimizer_shard_name(int64_t rank, int64_t shards) {
  return fmt::format("optimizer-rank{}-of-{}.safetensors", rank, shards);
}

std::string encode_piece(const Piece& p) {
  return fmt::format("{},{},[{}]", p.offset, p.numel, fmt::join(p.full_shape, ","));
}

namespace {

// A whole number >= 0 that is all of `text`.
std::optional<int64_t> parse_count(std::string_view text) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || v < 0) return std::nullopt;
  return v;
}

}  // namespace

std::optional<Piece> parse_piece(std::string name, std::string_view text) {
  const size_t c1 = text.find(','), c2 = c1 == std::string_view::npos ? c1 : text.find(',', c1 + 1);
  if (c2 == std::string_view::npos) return std::nullopt;
  auto offset = parse_count(text.substr(0, c1));
  auto numel = parse_count(text.substr(c1 + 1, c2 - c1 - 1));
  std::string_view shape = text.substr(c2 + 1);
  if (!offset || !numel || shape.size() < 2 || shape.front() != '[' || shape.back() != ']') return std::nullopt;
  Piece p{std::move(name), *offset, *numel, {}};
  shape = shape.substr(1, shape.size() - 2);
  while (!shape.empty()) {
    const size_t comma = shape.find(',');
    auto d = parse_count(shape.substr(0, comma));
    if (!d) return std::nullopt;
    p.full_shape.push_back(*d);
    if (comma == std::string_view::npos) break;
    shape.remove_prefix(comma + 1);
    if (shape.empty()) return std::nullopt;  // "[2,]"
  }
  int64_t total = 1;
  for (int64_t d : p.full_shape) {
    if (d != 0 && total > INT64_MAX / d) return std::nullopt;
    total *= d;
  }
  if (p.offset > total || p.numel > total - p.offset) return std::nullopt;
  return p;
}

std::vector<safetensors::TensorSpec> ShardManifest::specs() const {
  std::vector<safetensors::TensorSpec> out;
  for (const ShardTensor& t : tensors) out.push_back({t.piece.name, t.dtype, t.stored_shape});
  for (const ShardCount& c : counts) out.push_back({c.name, safetensors::Dtype::kI64, {}});
  return out;
}

safetensors::Metadata ShardManifest::file_metadata() const {
  safetensors::Metadata out = metadata;
  for (const ShardTensor& t : tensors) out[t.piece.name] = encode_piece(t.piece);
  return out;
}

std::string ShardManifest::encode() const {
  json doc = {{"metadata", metadata}, {"tensors", json::array()}, {"counts", json::array()}};
  for (const ShardTensor& t : tensors)
    doc["tensors"].push_back({t.piece.name, t.piece.offset, t.piece.numel, t.piece.full_shape,
                              safetensors::dtype_name(t.dtype), t.stored_shape});
  for (const ShardCount& c : counts) doc["counts"].push_back({c.name, c.value});
  return doc.dump();
}

ShardManifest ShardManifest::decode(std::string_view text) {
  try {
    const json doc = json::parse(text);
    ShardManifest m;
    m.metadata = doc.at("metadata").get<safetensors::Metadata>();
    for (const json& t : doc.at("tensors")) {
      auto dtype = safetensors::parse_dtype(t.at(4).get<std::string>());
      if (!dtype) throw Error("unknown dtype");
      m.tensors.push_back({{t.at(0).get<std::string>(), t.at(1).get<int64_t>(), t.at(2).get<int64_t>(),
                            t.at(3).get<Shape>()},
                           *dtype,
                           t.at(5).get<Shape>()});
    }
    for (const json& c : doc.at("counts")) m.counts.push_back({c.at(0).get<std::string>(), c.at(1).get<int64_t>()});
    return m;
  } catch (const json::exception& e) {
    throw Error(fmt::format("optimizer shard manifest: {}", e.what()));
  }
}

namespace {

[[noreturn]] void fail(std::string_view source, const std::string& problem) {
  throw Error(fmt::format("{}: {}", source, problem));
}

void pread_all(int fd, std::byte* dst, uint64_t n, uint64_t at, const std::string& source) {
  while (n > 0) {
    const ssize_t got = ::pread(fd, dst, std::min<uint64_t>(n, uint64_t{1} << 30), static_cast<off_t>(at));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw_os_error("cannot read", source, errno);
    if (got == 0) fail(source, "file shrank while being read");
    dst += got;
    at += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
  }
}

struct OpenedFile {
  std::string source;
  safetensors::Header header;
  uint64_t data_start = 0;
  std::string nonfinite;  // "<source>: <tensor>: <count> non-finite value(s) ...", or ""
};

// One pass over the whole file in chunks for its CRC-32, the header, then a second pass for the
// non-finite values of its floating-point tensors: never more than one chunk in memory.
OpenedFile check_file(int fd, const std::string& source, const FileDigest& digest) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) fail(source, "not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size != digest.bytes)
    fail(source, fmt::format("{} bytes, state.json records {} (truncated or replaced)", size, digest.bytes));
  std::vector<std::byte> chunk(static_cast<size_t>(std::min<uint64_t>(size, kStreamChunkBytes)));
  uLong crc = ::crc32_z(0, nullptr, 0);
  for (uint64_t at = 0; at < size; at += chunk.size()) {
    const uint64_t n = std::min<uint64_t>(chunk.size(), size - at);
    pread_all(fd, chunk.data(), n, at, source);
    crc = ::crc32_z(crc, reinterpret_cast<const Bytef*>(chunk.data()), n);
  }
  if (static_cast<uint32_t>(crc) != digest.crc32)
    fail(source, fmt::format("CRC-32 {:08x}, state.json records {:08x} (the file is damaged)", static_cast<uint32_t>(crc),
                             digest.crc32));
  OpenedFile file{source, {}, 0, {}};
  if (size < 8) fail(source, fmt::format("{} bytes, too short for the 8-byte header length", size));
  uint64_t length = 0;
  pread_all(fd, reinterpret_cast<std::byte*>(&length), 8, 0, source);
  if (length > safetensors::kMaxHeaderBytes || length > size - 8)
    fail(source, fmt::format("header length {} exceeds the {} bytes after it", length, size - 8));
  std::string text(length, '\0');
  pread_all(fd, reinterpret_cast<std::byte*>(text.data()), length, 8, source);
  file.data_start = 8 + length;
  file.header = safetensors::parse_header(text, size - file.data_start, source);
  // The tensors' values, one chunk at a time (a second pass: the header had to be trusted first).
  for (const safetensors::TensorInfo& t : file.header.tensors) {
    NonfiniteValues total;
    const size_t element = safetensors::dtype_size(t.dtype);
    const uint64_t step = kStreamChunkBytes / element * element;
    for (uint64_t at = t.begin; at < t.end && total.count == 0; at += step) {
      const uint64_t n = std::min<uint64_t>(step, t.end - at);
      if (safetensors::dtype_size(t.dtype) != 4 && safetensors::dtype_size(t.dtype) != 8) break;
      pread_all(fd, chunk.data(), n, file.data_start + at, source);
      NonfiniteValues v = find_nonfinite(t.dtype, {chunk.data(), static_cast<size_t>(n)});
      if (v.count > 0) {
        total = v;
        total.first_index += static_cast<int64_t>((at - t.begin) / element);
      }
    }
    if (total.count > 0 && file.nonfinite.empty()) file.nonfinite = fmt::format("{}: {}: {}", source, t.name, describe(total));
  }
  return file;
}

int open_read(const std::string& source) {
  const int fd = ::open(source.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_os_error("cannot open", source, errno);
  return fd;
}

// Each tensor's pieces sorted by offset must tile [0, numel) exactly once.
void check_coverage(const StoredTensor& t, const std::vector<std::string>& sources) {
  int64_t covered = 0;
  const StoredPiece* previous = nullptr;
  for (const StoredPiece& p : t.pieces) {
    if (p.offset < covered)
      fail(sources[static_cast<size_t>(p.file)],
           fmt::format("tensor '{}': elements [{}, {}) are also in {}", t.name, p.offset,
                       std::min(covered, p.offset + p.numel), sources[static_cast<size_t>(previous->file)]));
    if (p.offset > covered)
      fail(sources[static_cast<size_t>(p.file)],
           fmt::format("tensor '{}': elements [{}, {}) of its {} are in no shard file (this one starts at {})", t.name,
                       covered, p.offset, t.numel(), p.offset));
    covered = p.offset + p.numel;
    previous = &p;
  }
  if (covered != t.numel())
    fail(previous ? sources[static_cast<size_t>(previous->file)] : sources.front(),
         fmt::format("tensor '{}': elements [{}, {}) of its {} are in no shard file", t.name, covered, t.numel(),
                     t.numel()));
}

}  // namespace

OptimizerFiles::OptimizerFiles(OptimizerFiles&& o) noexcept { *this = std::move(o); }

OptimizerFiles& OptimizerFiles::operator=(OptimizerFiles&& o) noexcept {
  if (this == &o) return *this;
  for (int fd : fds_) ::close(fd);
  sharded_ = o.sharded_;
  sources_ = std::move(o.sources_);
  fds_ = std::exchange(o.fds_, {});
  metadata_ = std::move(o.metadata_);
  tensors_ = std::move(o.tensors_);
  counts_ = std::move(o.counts_);
  nonfinite_ = std::move(o.nonfinite_);
  return *this;
}

OptimizerFiles::~OptimizerFiles() {
  for (int fd : fds_) ::close(fd);
}

OptimizerFiles OptimizerFiles::open(const fs::path& dir, const TrainingState& state) {
  OptimizerFiles out;
  std::vector<std::string> names;
  out.sharded_ = !(state.optimizer_shards == 1 && state.files.contains(std::string(kOptimizerFile)));
  if (!out.sharded_)
    names.emplace_back(kOptimizerFile);
  else
    for (int64_t r = 0; r < state.optimizer_shards; ++r) names.push_back(optimizer_shard_name(r, state.optimizer_shards));
  std::map<std::string, StoredTensor> tensors;
  std::map<std::string, std::pair<int64_t, int>> counts;  // value, file
  for (const std::string& name : names) {
    auto digest = state.files.find(name);
    if (digest == state.files.end()) fail((dir / kStateFile).string(), fmt::format("files: no entry for {}", name));
    const std::string source = (dir / name).string();
    const int index = static_cast<int>(out.sources_.size());
    out.sources_.push_back(source);
    out.fds_.push_back(open_read(source));
    const OpenedFile file = check_file(out.fds_.back(), source, digest->second);
    if (out.nonfinite_.empty()) out.nonfinite_ = file.nonfinite;
    for (const safetensors::TensorInfo& info : file.header.tensors) {
      if (info.dtype == safetensors::Dtype::kI64) {  // a step count, replicated on every rank
        if (info.end - info.begin != 8)
          fail(source, fmt::format("tensor '{}' is I64 {}, expected one I64", info.name, shape_str(info.shape)));
        int64_t value = 0;
        pread_all(out.fds_.back(), reinterpret_cast<std::byte*>(&value), 8, file.data_start + info.begin, source);
        auto [it, fresh] = counts.try_emplace(info.name, value, index);
        if (!fresh && it->second.first != value)
          fail(source, fmt::format("count '{}' is {}, {} holds {}", info.name, value,
                                   out.sources_[static_cast<size_t>(it->second.second)], it->second.first));
        continue;
      }
      Piece piece{info.name, 0, shape_numel(info.shape), info.shape};
      if (out.sharded_) {
        auto meta = file.header.metadata.find(info.name);
        std::optional<Piece> parsed =
            meta == file.header.metadata.end() ? std::nullopt : parse_piece(info.name, meta->second);
        if (!parsed)
          fail(source, fmt::format("tensor '{}': __metadata__ has {}, not \"<offset>,<numel>,[<full shape>]\"", info.name,
                                   meta == file.header.metadata.end() ? "no entry for it" : "'" + meta->second + "'"));
        if (parsed->numel != piece.numel)
          fail(source, fmt::format("tensor '{}': __metadata__ says {} elements, the tensor holds {}", info.name,
                                   parsed->numel, piece.numel));
        piece = *parsed;
      }
      auto [it, fresh] = tensors.try_emplace(info.name, StoredTensor{info.name, info.dtype, piece.full_shape, {}});
      StoredTensor& t = it->second;
      if (!fresh && (t.dtype != info.dtype || t.full_shape != piece.full_shape))
        fail(source, fmt::format("tensor '{}' is {} {}, {} holds it as {} {}", info.name, safetensors::dtype_name(info.dtype),
                                 shape_str(piece.full_shape), out.sources_[static_cast<size_t>(t.pieces.front().file)],
                                 safetensors::dtype_name(t.dtype), shape_str(t.full_shape)));
      t.pieces.push_back({index, piece.offset, piece.numel, file.data_start + info.begin});
    }
    if (index == 0) {
      out.metadata_ = file.header.metadata;
      if (out.sharded_)
        for (const safetensors::TensorInfo& info : file.header.tensors) out.metadata_.erase(info.name);
    }
  }
  for (auto& [name, t] : tensors) {
    std::erase_if(t.pieces, [](const StoredPiece& p) { return p.numel == 0; });
    std::sort(t.pieces.begin(), t.pieces.end(),
              [](const StoredPiece& a, const StoredPiece& b) { return a.offset < b.offset; });
    check_coverage(t, out.sources_);
    out.tensors_.push_back(std::move(t));
  }
  for (const auto& [name, value] : counts) out.counts_.push_back({name, value.first});
  return out;
}

const StoredTensor* OptimizerFiles::find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const StoredTensor& t, std::string_view n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

void OptimizerFiles::read(const StoredTensor& t, int64_t offset, int64_t numel, std::byte* dst) const {
  DTRAIN_CHECK(offset >= 0 && numel >= 0 && offset + numel <= t.numel(), "read of [{}, {}) from '{}' of {} elements",
               offset, offset + numel, t.name, t.numel());
  const size_t element = safetensors::dtype_size(t.dtype);
  const int64_t end = offset + numel;
  for (const StoredPiece& p : t.pieces) {
    const int64_t a = std::max(offset, p.offset), b = std::min(end, p.offset + p.numel);
    if (a >= b) continue;
    pread_all(fds_[static_cast<size_t>(p.file)], dst + static_cast<size_t>(a - offset) * element,
              static_cast<uint64_t>(b - a) * element, p.data_begin + static_cast<uint64_t>(a - p.offset) * element,
              sources_[static_cast<size_t>(p.file)]);
  }
}

uint64_t consolidate(const OptimizerFiles& files, const std::string& path, size_t chunk_bytes) {
  std::vector<safetensors::TensorSpec> specs;
  for (const StoredTensor& t : files.tensors()) specs.push_back({t.name, t.dtype, t.full_shape});
  for (const ShardCount& c : files.counts()) specs.push_back({c.name, safetensors::Dtype::kI64, {}});
  remove_stale_temporaries(path);  // a killed writer's, never a live one's
  const std::string temp = temporary_path(path);
  uint64_t written = 0;
  {
    DurableFile file(temp, nullptr);
    written += safetensors::write_header(file, specs, files.metadata());
    std::vector<std::byte> chunk;
    for (size_t i : safetensors::data_order(specs)) {
      if (i >= files.tensors().size()) {
        const int64_t value = files.counts()[i - files.tensors().size()].value;
        file.write(std::as_bytes(std::span(&value, 1)));
        written += 8;
        continue;
      }
      const StoredTensor& t = files.tensors()[i];
      const size_t element = safetensors::dtype_size(t.dtype);
      const int64_t step = std::max<int64_t>(1, static_cast<int64_t>(chunk_bytes / element));
      for (int64_t at = 0; at < t.numel(); at += step) {
        const int64_t n = std::min(step, t.numel() - at);
        chunk.resize(static_cast<size_t>(n) * element);
        files.read(t, at, n, chunk.data());
        file.write(chunk);
        written += chunk.size();
      }
    }
    file.commit();
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(temp.c_str());
    throw_os_error("cannot rename to", path, err);
  }
  return written;
}

}  // namespace dtrain::checkpoint
