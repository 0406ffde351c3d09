// Saving checkpoints: atomically (Note [Checkpoint layout] in checkpoint_layout.h), keeping the
// newest K, synchronously or on a background thread while training continues.
//
// The caller takes a CheckpointSnapshot between two optimizer steps (host copies of the
// parameters and the optimizer state, see safetensors::host_copy) and hands it over; from then
// on training may change its tensors. At most one save is in flight: a second save_async()
// waits for the first. A failed save leaves the older checkpoints and `latest` as they were and
// no step-<N> directory behind; its error (one line naming the path and the OS error) is thrown
// by the next call to save(), save_async() or wait().
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint_layout.h"
#include "checkpoint/host_buffer_pool.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/training_state.h"

namespace dtrain::checkpoint {

class DurableFile;  // checkpoint/durable_file.h (not installed: include it to use create())
class FaultBudget;

struct CheckpointWriterOptions {
  std::filesystem::path dir;  // created when missing
  int keep = kDefaultKeep;    // newest checkpoints kept, >= 1
  // Tests only: stop the process dead after this many bytes of a save (kFaultEnv).
  std::optional<uint64_t> fault_after_bytes = parse_fault_after_bytes(std::getenv(kFaultEnv));
};

// A save whose optimizer state comes in shards (Note [Sharded optimizer state]): its temporary
// directory is made first and the shard files are streamed into it as their bytes arrive (from
// other ranks, one chunk at a time), before the snapshot of the model is handed to the writer,
// which completes the directory as any save. Destroyed before that, it removes what it wrote.
class ShardedSave {
 public:
  ShardedSave(const CheckpointWriterOptions& options, int64_t step, int64_t shards);
  ~ShardedSave();
  ShardedSave(const ShardedSave&) = delete;
  ShardedSave& operator=(const ShardedSave&) = delete;

  int64_t shards() const { return shards_; }
  // A new file `name` in the save's directory; commit() it when written, then add() it.
  std::unique_ptr<DurableFile> create(const std::string& name);
  void add(const std::string& name, const DurableFile& committed);

  // For the writer: the files written, the directory, the save's budget; hand_over() once the
  // writer's own clean-up owns the directory.
  const std::map<std::string, FileDigest>& files() const { return files_; }
  const std::filesystem::path& temp() const { return temp_; }
  FaultBudget& budget() { return *budget_; }
  void hand_over() { handed_over_ = true; }

 private:
  std::filesystem::path temp_;
  int64_t shards_;
  std::unique_ptr<FaultBudget> budget_;
  std::map<std::string, FileDigest> files_;
  bool handed_over_ = false;
};

struct CheckpointSnapshot {
  TrainingState state;  // its global_step names the directory; the writer fills files/versions
  std::vector<safetensors::HostTensor> model;
  safetensors::Metadata model_metadata;  // e.g. the architecture, for loading without flags
  std::vector<safetensors::HostTensor> optimizer;  // empty when `sharded` holds the state
  safetensors::Metadata optimizer_metadata;
  std::shared_ptr<ShardedSave> sharded;  // the shard files already written, or null
};

// Writes one checkpoint now; returns its directory once `latest` names it and older ones beyond
// `keep` are gone. Fills snapshot.state's writer fields. What a crashed save left behind is
// removed by the next DirectoryLock on `dir`, not here: another job's save may be in flight.
std::filesystem::path write_checkpoint(const CheckpointWriterOptions& options, CheckpointSnapshot& snapshot);

class CheckpointWriter {
 public:
  explicit CheckpointWriter(CheckpointWriterOptions options);
  // Waits for a save in flight; an error nobody collected with wait() is printed to stderr.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Waits for a save in flight (throwing its error), then writes `snapshot` before returning.
  std::filesystem::path save(CheckpointSnapshot snapshot);
  // Waits for a save in flight (throwing its error, in which case `snapshot` is not written),
  // then starts writing `snapshot` on a background thread and returns.
  void save_async(CheckpointSnapshot snapshot);
  // Waits for the save in flight, if any; throws its error.
  void wait();
  // A save was started and not yet waited for (it may have finished).
  bool in_flight() const { return thread_.joinable(); }
  // The background thread is still writing (never blocks).
  bool writing() const { return writing_.load(std::memory_order_acquire); }
  const CheckpointWriterOptions& options() const { return options_; }
  // Memory for the next snapshot (safetensors::host_copy(name, t, &writer.buffers())): a
  // snapshot's buffers come back here once written, so the next snapshot copies into memory that
  // is already mapped. Take the snapshot after the previous save is done (check writing()) to
  // reuse them rather than allocate a second set.
  HostBufferPool& buffers() { return buffers_; }

 private:
  CheckpointWriterOptions options_;
  HostBufferPool buffers_;
  std::thread thread_;
  std::exception_ptr error_;  // set by the thread, read after join
  std::atomic<bool> writing_{false};
};

}  // namespace dtrain::checkpoint
