#include "checkpoint/checkpoint_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include <fmt/format.h>

#include "checkpoint/durable_file.h"
#include "checkpoint/finite.h"
#include "core/error.h"
#include "core/poison.h"

namespace dtrain::checkpoint {
namespace fs = std::filesystem;

namespace {

FileDigest write_tensor_file(const fs::path& path, const std::vector<safetensors::HostTensor>& tensors,
                             const safetensors::Metadata& metadata, FaultBudget& budget) {
  DurableFile file(path, &budget);
  safetensors::write(file, safetensors::refs(tensors), metadata);
  file.commit();
  return {file.size(), file.crc32()};
}

FileDigest write_text_file(const fs::path& path, std::string_view text, FaultBudget& budget) {
  DurableFile file(path, &budget);
  file.write(std::as_bytes(std::span(text)));
  file.commit();
  return {file.size(), file.crc32()};
}

void make_directory(const fs::path& dir) {
  if (::mkdir(dir.c_str(), 0755) != 0) throw_os_error("cannot create directory", dir, errno);
}

// Moves the complete temporary directory to `target` in one step. An existing `target` (a run
// resumed from an older checkpoint saves this step again) is swapped out atomically, so the
// name never points at nothing, and then deleted.
void publish(const fs::path& temp, const fs::path& target) {
  if (::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE) == 0) return;
  int err = errno;
  if (err == EEXIST) {
    if (::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) != 0)
      throw_os_error(fmt::format("cannot replace {} with", target.string()), temp, errno);
    std::error_code ec;
    fs::remove_all(temp, ec);  // the old content now; a leftover if this fails
    return;
  }
  if (err != EINVAL && err != ENOSYS) throw_os_error(fmt::format("cannot rename {} to", temp.string()), target, err);
  // A filesystem without renameat2 flags: plain rename, which replaces an empty target only.
  if (::rename(temp.c_str(), target.c_str()) != 0)
    throw_os_error(fmt::format("cannot rename {} to", temp.string()), target, errno);
}

void write_latest(const fs::path& dir, int64_t step, FaultBudget& budget) {
  const fs::path temp = dir / fmt::format("{}latest-{}", kTempPrefix, ::getpid());
  write_text_file(temp, latest_content(step), budget);
  const fs::path latest = dir / kLatestFile;
  if (::rename(temp.c_str(), latest.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    throw_os_error(fmt::format("cannot rename {} to", temp.string()), latest, err);
  }
  fsync_directory(dir);
}

// Deletes the older checkpoints beyond `keep` (steps_to_delete: never one newer than `newest`),
// each renamed away first so none is seen half-deleted.
void prune(const fs::path& dir, int64_t newest, int keep) {
  std::vector<int64_t> existing;
  for (const auto& entry : fs::directory_iterator(dir))
    if (auto step = parse_step_dir_name(entry.path().filename().string()); step && entry.is_directory())
      existing.push_back(*step);
  for (int64_t step : steps_to_delete(existing, newest, keep)) {
    const fs::path old = dir / step_dir_name(step);
    const fs::path doomed = dir / fmt::format("{}delete-{}-{}", kTempPrefix, step_dir_name(step), ::getpid());
    if (::rename(old.c_str(), doomed.c_str()) != 0) throw_os_error("cannot delete the old checkpoint", old, errno);
    std::error_code ec;
    fs::remove_all(doomed, ec);
    if (ec) throw_os_error("cannot delete the old checkpoint", old, ec.value());
  }
}

// Note [A poisoned step is never saved] (core/poison.h): asked before each step that makes a
// save visible, so a collective that failed or timed out while the save was written stops it.
void refuse_if_poisoned() {
  if (const std::string why = process_poison(); !why.empty())
    throw Error(fmt::format("a collective of this process failed, so its state may be wrong: {}", why));
}

fs::path temp_step_directory(const fs::path& dir, int64_t step) {
  return dir / fmt::format("{}{}-{}", kTempPrefix, step_dir_name(step), ::getpid());
}

// The step directory, complete and fsynced under its final name; nothing of it on failure.
void write_step_directory(const fs::path& dir, const fs::path& target, CheckpointSnapshot& snapshot,
                          FaultBudget& budget) {
  const fs::path temp = temp_step_directory(dir, snapshot.state.global_step);
  if (!snapshot.sharded) make_directory(temp);  // a sharded save made it, and wrote its shards
  try {
    TrainingState& state = snapshot.state;
    state.format_version = kFormatVersion;
    state.dtrain_version = dtrain_version();
    state.files.clear();
    // A pipeline's save streamed the model into the sharded save's directory already (Note
    // [Pipeline checkpoints] in train/checkpointer.h).
    if (!snapshot.sharded || !snapshot.sharded->files().contains(std::string(kModelFile)))
      state.files[std::string(kModelFile)] =
          write_tensor_file(temp / kModelFile, snapshot.model, snapshot.model_metadata, budget);
    if (snapshot.sharded) {  // Note [Sharded optimizer state]
      state.optimizer_shards = snapshot.sharded->shards();
      state.files.insert(snapshot.sharded->files().begin(), snapshot.sharded->files().end());
    } else {
      state.optimizer_shards = 1;
      state.files[std::string(kOptimizerFile)] =
          write_tensor_file(temp / kOptimizerFile, snapshot.optimizer, snapshot.optimizer_metadata, budget);
    }
    write_text_file(temp / kStateFile, encode_state(state), budget);
    fsync_directory(temp);
    if (!publish_unless_poisoned([&] { publish(temp, target); })) refuse_if_poisoned();
    fsync_directory(dir);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(temp, ec);
    throw;
  }
}

}  // namespace

fs::path write_checkpoint(const CheckpointWriterOptions& options, CheckpointSnapshot& snapshot) {
  DTRAIN_CHECK(options.keep >= 1, "keep {} checkpoints", options.keep);
  const fs::path& dir = options.dir;
  const fs::path target = dir / step_dir_name(snapshot.state.global_step);
  // The trainer votes on finiteness before it saves; this is the library's own guarantee that a
  // NaN never replaces a good checkpoint (nothing in DIR is touched).
  for (const auto& [file, tensors] : {std::pair{kModelFile, &snapshot.model}, std::pair{kOptimizerFile, &snapshot.optimizer}})
    if (const std::string bad = first_nonfinite_tensor(*tensors); !bad.empty())
      throw Error(fmt::format("checkpoint {} not saved: {}: {}", target.string(), file, bad));
  try {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw_os_error("cannot create directory", dir, ec.value());
    refuse_if_poisoned();  // before any byte: not even a temporary folder
    FaultBudget own_budget(options.fault_after_bytes);
    // A sharded save's budget already counts its shards' bytes: one budget per save.
    FaultBudget& budget = snapshot.sharded ? snapshot.sharded->budget() : own_budget;
    if (snapshot.sharded) {
      DTRAIN_CHECK(snapshot.sharded->temp() == temp_step_directory(dir, snapshot.state.global_step),
                   "a sharded save of {} handed over with the snapshot of step {}", snapshot.sharded->temp().string(),
                   snapshot.state.global_step);
      snapshot.sharded->hand_over();  // the step directory's clean-up owns it now
    }
    write_step_directory(dir, target, snapshot, budget);
    // The step folder stays; `latest` keeps naming the one before.
    if (!publish_unless_poisoned([&] { write_latest(dir, snapshot.state.global_step, budget); })) refuse_if_poisoned();
    prune(dir, snapshot.state.global_step, options.keep);
  } catch (const Error& e) {
    throw Error(fmt::format("checkpoint {} not saved: {}", target.string(), e.what()));
  } catch (const fs::filesystem_error& e) {
    throw Error(fmt::format("checkpoint {} not saved: {}", target.string(), e.what()));
  }
  return target;
}

ShardedSave::ShardedSave(const CheckpointWriterOptions& options, int64_t step, int64_t shards)
    : temp_(temp_step_directory(options.dir, step)),
      shards_(shards),
      budget_(std::make_unique<FaultBudget>(options.fault_after_bytes)) {
  DTRAIN_CHECK(shards >= 1, "{} optimizer shards", shards);
  const fs::path target = options.dir / step_dir_name(step);
  try {
    std::error_code ec;
    fs::create_directories(options.dir, ec);
    if (ec) throw_os_error("cannot create directory", options.dir, ec.value());
    refuse_if_poisoned();
    make_directory(temp_);
  } catch (const Error& e) {
    handed_over_ = true;  // nothing of ours to remove
    throw Error(fmt::format("checkpoint {} not saved: {}", target.string(), e.what()));
  }
}

ShardedSave::~ShardedSave() {
  if (handed_over_) return;
  std::error_code ec;
  fs::remove_all(temp_, ec);
}

std::unique_ptr<DurableFile> ShardedSave::create(const std::string& name) {
  return std::make_unique<DurableFile>(temp_ / name, budget_.get());
}

void ShardedSave::add(const std::string& name, const DurableFile& committed) {
  files_[name] = {committed.size(), committed.crc32()};
}

CheckpointWriter::CheckpointWriter(CheckpointWriterOptions options) : options_(std::move(options)) {
  DTRAIN_CHECK(options_.keep >= 1, "keep {} checkpoints", options_.keep);
}

CheckpointWriter::~CheckpointWriter() {
  if (thread_.joinable()) thread_.join();
  if (!error_) return;
  try {
    std::rethrow_exception(error_);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
}

void CheckpointWriter::wait() {
  if (thread_.joinable()) thread_.join();
  if (auto error = std::exchange(error_, nullptr)) std::rethrow_exception(error);
}

fs::path CheckpointWriter::save(CheckpointSnapshot snapshot) {
  wait();
  return write_checkpoint(options_, snapshot);
}

void CheckpointWriter::save_async(CheckpointSnapshot snapshot) {
  wait();
  writing_.store(true, std::memory_order_release);
  try {
    thread_ = std::thread([this, snapshot = std::move(snapshot)]() mutable {
      try {
        write_checkpoint(options_, snapshot);
      } catch (...) {
        error_ = std::current_exception();
      }
      snapshot = {};  // the buffers go back to the pool before the caller learns the save is done
      writing_.store(false, std::memory_order_release);
    });
  } catch (...) {
    writing_.store(false, std::memory_order_release);
    throw;
  }
}

}  // namespace dtrain::checkpoint
