// Data format names and detection: look at what DIR holds, open nothing beyond a 4-byte peek.
#include "data/data_format.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"
#include "core/named_enum.h"
#include "data/mnist.h"
#include "data/npy_dataset.h"
#include "data/token_shards.h"

namespace dtrain {
namespace {

constexpr auto kDataFormats = enum_names<DataFormat>(std::pair{DataFormat::kAuto, "auto"},
                                                     std::pair{DataFormat::kIdx, "idx"},
                                                     std::pair{DataFormat::kLlmc, "llmc"},
                                                     std::pair{DataFormat::kNpy, "npy"});

// The first little-endian int32 of `path`; nullopt when it cannot be read (too short, unreadable).
std::optional<int32_t> first_int32(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return std::nullopt;
  int32_t v = 0;
  const bool ok = std::fread(&v, sizeof v, 1, f) == 1;
  std::fclose(f);
  return ok ? std::optional<int32_t>(v) : std::nullopt;
}

}  // namespace

const char* data_format_name(DataFormat format) { return kDataFormats.name(format); }
std::optional<DataFormat> parse_data_format(std::string_view name) { return kDataFormats.parse(name); }

DataFormat detect_data_format(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw Error(fmt::format("{}: data directory not found", dir), ErrorKind::kData);
  const std::vector<std::string> shards = shard_files(dir, "train");
  for (const std::string& path : shards) {
    const std::optional<int32_t> magic = first_int32(path);
    if (magic && (*magic == kShardMagicU16 || *magic == kShardMagicU32)) return DataFormat::kLlmc;
  }
  const std::string images = MnistDataset::file_stem(Split::kTrain, true);
  for (const std::string& name : {images + ".gz", images})
    if (fs::exists(fs::path(dir) / name, ec)) return DataFormat::kIdx;
  if (has_npy_data(dir)) return DataFormat::kNpy;
  const std::string shard_text =
      shards.empty() ? "no llm.c token shards (*train*.bin)"
                     : fmt::format("no llm.c token shards ({} does not start with magic {} or {})",
                                   fs::path(shards.front()).filename().string(), kShardMagicU16, kShardMagicU32);
  throw Error(fmt::format("{}: {}, no IDX files ({}[.gz]) and no NumPy data (train.npz or train_x.npy): not a data "
                          "directory dtrain reads",
                          dir, shard_text, images),
              ErrorKind::kData);
}

}  // namespace dtrain
