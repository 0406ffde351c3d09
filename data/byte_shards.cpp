// Byte-level shards: the walk over text files (llmc_shards.py's order), the split, the writes.
#include "data/byte_shards.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <new>
#include <span>

#include <fmt/format.h>

#include "core/error.h"
#include "data/token_shards.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void bad_input(const std::string& message) { throw Error(message, ErrorKind::kData); }

bool has_text_suffix(const std::string& name) {
  return std::any_of(std::begin(kTextSuffixes), std::end(kTextSuffixes),
                     [&](const char* suffix) { return name.ends_with(suffix); });
}

// os.walk(dir) top-down with its subfolders sorted: this folder's text files, then each subfolder.
void walk(const fs::path& dir, std::vector<std::string>& out) {
  std::vector<std::string> files, dirs;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code type_ec;
    const bool is_link = it->is_symlink(type_ec);
    if (it->is_directory(type_ec)) {
      if (!is_link) dirs.push_back(name);  // os.walk lists links to folders but does not enter them
    } else if (it->is_regular_file(type_ec) && has_text_suffix(name)) {
      files.push_back(name);
    }
  }
  if (ec) bad_input(fmt::format("{}: cannot list the folder: {}", dir.string(), ec.message()));
  std::sort(files.begin(), files.end());  // bytewise: Python's sorted() order for UTF-8 names
  std::sort(dirs.begin(), dirs.end());
  for (const std::string& f : files) out.push_back((dir / f).string());
  for (const std::string& d : dirs) walk(dir / d, out);
}

// Appends the whole of `path` to `data`.
void append_file(const std::string& path, std::vector<uint8_t>& data) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) bad_input(fmt::format("{}: cannot read: {}", path, std::strerror(errno)));
  uint8_t buf[1 << 16];
  size_t got = 0;
  while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) data.insert(data.end(), buf, buf + got);
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  if (failed) bad_input(fmt::format("{}: cannot read: {}", path, std::strerror(err)));
}

std::string shard_name(const char* split, int64_t index) { return fmt::format("bytes_{}_{:06d}.bin", split, index); }

// bytes_train_NNNNNN.bin files in `dir` numbered `count` or above: left from a larger earlier run.
std::vector<std::string> stale_train_shards(const fs::path& dir, int64_t count) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    constexpr std::string_view prefix = "bytes_train_", suffix = ".bin";
    if (!name.starts_with(prefix) || !name.ends_with(suffix)) continue;
    const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    if (digits.size() < 6 || digits.size() > 12 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    if (std::stoll(digits) >= count) out.push_back(it->path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::vector<std::string> text_files(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const std::string& p : paths) {
    std::error_code ec;
    const fs::file_status st = fs::status(p, ec);
    if (ec || !fs::exists(st))
      bad_input(fmt::format("{}: {}", p, ec && ec != std::errc::no_such_file_or_directory ? ec.message()
                                                                                             : "no such file or folder"));
    if (fs::is_directory(st))
      walk(p, out);
    else if (fs::is_regular_file(st))
      out.push_back(p);
    else
      bad_input(fmt::format("{}: neither a file nor a folder", p));
  }
  return out;
}

int64_t validation_bytes(int64_t total, std::optional<double> fraction) {
  if (fraction) return static_cast<int64_t>(std::floor(static_cast<long double>(total) * *fraction));
  return std::min(total / 20, kByteValMax);
}

ByteShardSummary write_byte_shards(const std::vector<std::string>& paths, const std::string& out_dir,
                                   std::optional<double> val_fraction) {
  const std::vector<std::string> files = text_files(paths);
  std::vector<uint8_t> data;
  try {
    for (const std::string& f : files) append_file(f, data);
  } catch (const std::bad_alloc&) {
    throw Error(fmt::format("the text of {} files does not fit in memory ({} bytes read)", files.size(), data.size()),
                ErrorKind::kResources);
  }
  if (data.empty()) {
    std::string given;
    for (const std::string& p : paths) given += (given.empty() ? "" : " ") + p;
    bad_input(fmt::format("no text found in {} (files, or folders of *.py *.txt *.md *.rst *.h *.c)", given));
  }
  const auto total = static_cast<int64_t>(data.size());
  const int64_t nval = validation_bytes(total, val_fraction);
  // A split under 2 tokens has no (input, target) pair: training or evaluation on it would fail
  // later, far from the cause, so refuse before anything is written.
  if (nval < 2 || total - nval < 2)
    bad_input(fmt::format("{}: {} bytes of text split into {} validation and {} training tokens; each split needs "
                          "at least 2 (more text, or another --val-fraction)",
                          out_dir, total, nval, total - nval));
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec || !fs::is_directory(out_dir, ec))
    throw Error(fmt::format("{}: cannot create the output folder: {}", out_dir, ec ? ec.message() : "not a folder"),
                ErrorKind::kOutput);
  ByteShardSummary s;
  s.val_tokens = nval;
  s.train_tokens = total - nval;
  const std::span<const uint8_t> all(data);
  s.files.push_back((fs::path(out_dir) / shard_name("val", 0)).string());
  write_token_shard(s.files.back(), all.first(static_cast<size_t>(nval)));
  int64_t index = 0;
  for (int64_t at = nval; at < total; at += kByteShardTokens, ++index) {
    s.files.push_back((fs::path(out_dir) / shard_name("train", index)).string());
    const int64_t n = std::min(kByteShardTokens, total - at);
    write_token_shard(s.files.back(), all.subspan(static_cast<size_t>(at), static_cast<size_t>(n)));
  }
  for (const std::string& stale : stale_train_shards(out_dir, index)) {
    fs::remove(stale, ec);
    if (ec)
      throw Error(fmt::format("{}: cannot remove this shard of an earlier run: {}", stale, ec.message()),
                  ErrorKind::kOutput);
    s.removed.push_back(stale);
  }
  return s;
}

}  // namespace dtrain
