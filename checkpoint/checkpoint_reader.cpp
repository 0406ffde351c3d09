#include "checkpoint/checkpoint_reader.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/checkpoint_layout.h"
#include "checkpoint/durable_file.h"
#include "core/error.h"

namespace dtrain::checkpoint {
namespace fs = std::filesystem;

namespace {

// A file of the checkpoint, read once, its size and CRC-32 checked against state.json.
safetensors::File read_checked(const fs::path& dir, std::string_view name, const TrainingState& state) {
  const fs::path path = dir / name;
  const std::string source = path.string();
  auto digest = state.files.find(std::string(name));
  if (digest == state.files.end())
    throw Error(fmt::format("{}: files: no entry for {}", (dir / kStateFile).string(), name));
  FileBytes file = read_whole_file(path);
  if (file.size != digest->second.bytes)
    throw Error(fmt::format("{}: {} bytes, state.json records {} (truncated or replaced)", source, file.size,
                            digest->second.bytes));
  const uint32_t crc = crc32_of({file.data.get(), file.size});
  if (crc != digest->second.crc32)
    throw Error(fmt::format("{}: CRC-32 {:08x}, state.json records {:08x} (the file is damaged)", source, crc,
                            digest->second.crc32));
  return safetensors::File(std::move(file.data), file.size, source);
}

TrainingState read_state(const fs::path& dir) {
  const fs::path path = dir / kStateFile;
  FileBytes file = read_whole_file(path);
  TrainingState state =
      decode_state(std::string_view(reinterpret_cast<const char*>(file.data.get()), file.size), path.string());
  // Note [Sharded optimizer state]: optimizer.safetensors, or one file per shard.
  auto expected = [&](const std::string& name) {
    if (name == kModelFile) return true;
    if (name == kOptimizerFile) return state.optimizer_shards == 1;
    for (int64_t r = 0; r < state.optimizer_shards; ++r)
      if (name == optimizer_shard_name(r, state.optimizer_shards)) return true;
    return false;
  };
  for (const auto& [name, digest] : state.files)
    if (!expected(name))
      throw Error(fmt::format("{}: files: unexpected entry '{}' (optimizer_shards {})", path.string(), name,
                              state.optimizer_shards));
  if (auto step = parse_step_dir_name(dir.filename().string()); step && *step != state.global_step)
    throw Error(fmt::format("{}: global_step: {}, but the directory is {}", path.string(), state.global_step,
                            dir.filename().string()));
  return state;
}

}  // namespace

std::optional<fs::path> find_latest(const fs::path& dir) {
  const fs::path latest = dir / kLatestFile;
  struct stat st {};
  if (::stat(latest.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::nullopt;  // no DIR, or nothing saved in it yet
    throw_os_error("cannot read", latest, errno);  // unreadable is not "nothing to resume"
  }
  if (!S_ISREG(st.st_mode)) throw Error(fmt::format("{}: not a regular file", latest.string()));
  std::error_code ec;
  FileBytes file = read_whole_file(latest);
  const std::string_view content(reinterpret_cast<const char*>(file.data.get()), std::min<uint64_t>(file.size, 64));
  auto step = file.size <= 64 ? parse_latest(content) : std::nullopt;
  if (!step) throw Error(fmt::format("{}: expected one line 'step-<N>', got '{}'", latest.string(),
                                     content.substr(0, content.find('\n'))));
  const fs::path target = dir / step_dir_name(*step);
  if (!fs::is_directory(target, ec))
    throw Error(fmt::format("{}: names {}, which does not exist", latest.string(), target.string()));
  return target;
}

std::vector<int64_t> list_steps(const fs::path& dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code ignored;
    if (auto step = parse_step_dir_name(it->path().filename().string()); step && it->is_directory(ignored))
      steps.push_back(*step);
  }
  std::sort(steps.begin(), steps.end(), std::greater<>());
  return steps;
}

namespace {

LoadedCheckpoint read_step_directory(const fs::path& dir) {
  TrainingState state = read_state(dir);
  safetensors::File model = read_checked(dir, kModelFile, state);
  OptimizerFiles optimizer = OptimizerFiles::open(dir, state);
  return LoadedCheckpoint{dir, std::move(state), std::move(model), std::move(optimizer), {}};
}

// Without `latest`: the newest step-<N> that reads back whole. Every older one stays untouched.
std::optional<LoadedCheckpoint> read_newest_complete(const fs::path& dir) {
  const std::vector<int64_t> steps = list_steps(dir);
  if (steps.empty()) return std::nullopt;
  std::vector<std::string> skipped;
  for (int64_t step : steps) {
    const fs::path candidate = dir / step_dir_name(step);
    try {
      LoadedCheckpoint loaded = read_step_directory(candidate);
      loaded.chosen_because = fmt::format("{} has no {}; using {}, the newest complete checkpoint", dir.string(),
                                          kLatestFile, candidate.string());
      if (!skipped.empty()) loaded.chosen_because += fmt::format(" (skipped: {})", fmt::join(skipped, "; "));
      return loaded;
    } catch (const Error& e) {
      skipped.push_back(e.what());
    }
  }
  throw Error(fmt::format("{} has no {} and none of its {} checkpoint(s) is complete: {}", dir.string(), kLatestFile,
                          steps.size(), fmt::join(skipped, "; ")));
}

}  // namespace

std::optional<LoadedCheckpoint> read_newest(const fs::path& dir) {
  if (auto latest = find_latest(dir)) return read_step_directory(*latest);
  return read_newest_complete(dir);
}

LoadedCheckpoint read_checkpoint(const fs::path& path) {
  std::error_code ec;
  if (fs::exists(path / kStateFile, ec)) return read_step_directory(path);
  if (auto loaded = read_newest(path)) return std::move(*loaded);
  if (!fs::is_directory(path, ec)) throw Error(fmt::format("{}: no such checkpoint directory", path.string()));
  throw Error(fmt::format("{}: neither a checkpoint ({} missing) nor a checkpoint directory ({} and step-<N> missing)",
                          path.string(), kStateFile, kLatestFile));
}

void check_config_matches(const LoadedCheckpoint& checkpoint, const nlohmann::json& current,
                          std::span<const std::string> may_differ) {
  if (auto diff = first_config_difference(checkpoint.state.config, current, may_differ))
    throw Error(fmt::format("{}: config.{}", (checkpoint.path / kStateFile).string(), *diff));
}

}  // namespace dtrain::checkpoint
