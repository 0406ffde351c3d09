// Checkpoints of a training run (layout: checkpoint/checkpoint_layout.h): what goes into them —
// the parameters under PyTorch's names with the architecture in __metadata__, the optimizer
// state, and state.json with where the run stands, the Dropout counters and the settings a
// resumed run must share — saving them on rank 0, and restoring them on every rank from what
// rank 0 read (app/root_broadcast.h: no shared filesystem needed).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/train_config.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/directory_lock.h"
#include "checkpoint/training_state.h"
#include "comm/communicator.h"
#include "ddp/bucket_plan.h"
#include "model/module.h"
#include "model/optimizer.h"

namespace dtrain {

// The settings a resumed run must share with the run that saved the checkpoint (state.json's
// "config"): all that changes results — model, widths, dropout, optimizer and its
// hyper-parameters, LR schedule (with --epochs as the cosine period), batch size, accumulation,
// AMP, DDP buckets and comm hook, normalisation, shuffling, data limits, seed. Not in it, so free
// to change: a larger --epochs (other schedules), the data folder, device, threads, the world
// size (see Trainer) and the output flags.
nlohmann::json resume_config(const TrainConfig& config);

// Where a run stands between two optimizer steps.
struct RunPosition {
  int64_t epoch = 0;            // the epoch in progress (or the next one, at an epoch end)
  int64_t step_in_epoch = 0;    // optimizer steps of it done
  int64_t sample_in_epoch = 0;  // global samples of it used: its position in the epoch's order
  int64_t global_step = 0;      // optimizer steps since the start
  int64_t samples_seen = 0;     // global samples since the start
};

// How long saving held training up, for the run's closing checkpoint line.
struct SaveTimes {
  std::vector<double> blocked_ms;     // per save, in all: the three below
  std::vector<double> previous_ms;    // waiting for the previous save to be written
  std::vector<double> snapshot_ms;    // copying parameters and optimizer state to host buffers
  std::vector<double> write_ms;       // writing, when synchronous
  std::vector<double> step_ms_while_writing, step_ms_otherwise;  // optimizer-step durations
};

// Saves checkpoints. Only rank 0 (replicas are identical) does anything, and from its start to
// its end it holds the lock of --checkpoint-dir (checkpoint/directory_lock.h), taken before
// anything reads the directory.
class CheckpointSaver {
 public:
  // Collective over `control`: a directory another job holds is the same AgreedError on every
  // rank ("DIR is in use by another dtrain job (pid P on HOST, since T); one job per
  // --checkpoint-dir").
  CheckpointSaver(Communicator& control, const CheckpointSettings& settings);

  // Snapshots `model` and `optimizer` with `state` (training may change them once this
  // returns; on a GPU the caller has synchronised the compute stream) after the previous save is
  // written, and returns the snapshot's first tensor holding a NaN or an infinity ("<file>:
  // <tensor>: <count> non-finite value(s) ..."), "" when all are finite or this rank does not
  // write. The ranks vote on it before write() (Note [Stopping on non-finite values]). Throws
  // the error of an earlier save.
  std::string snapshot(checkpoint::TrainingState state, Module& model, const Optimizer& optimizer,
                       const safetensors::Metadata& architecture);
  // Writes the snapshot, on the background thread unless the settings say otherwise.
  void write();
  // Drops the snapshot unwritten.
  void discard() { pending_.reset(); }
  // Waits for the save in flight; throws its error.
  void wait();
  // The path of the newest save ("" before the first).
  const std::string& last_path() const { return last_path_; }
  // A background save is being written now.
  bool writing() const;
  // Records an optimizer step's duration and whether a background save was being written
  // when it started (the step-time hiccup of the closing line).
  void record_step(double ms, bool while_writing);
  const SaveTimes& times() const { return times_; }
  // "checkpoint: 3 saves, training waited 2.1 ms (median) ..." ("" when nothing was saved).
  std::string summary() const;

 private:
  CheckpointSettings settings_;
  std::unique_ptr<checkpoint::DirectoryLock> lock_;       // rank 0 only; outlives writer_
  std::unique_ptr<checkpoint::CheckpointWriter> writer_;  // rank 0 only
  std::optional<checkpoint::CheckpointSnapshot> pending_;  // taken, not yet written
  double pending_previous_ms_ = 0, pending_snapshot_ms_ = 0;
  std::string last_path_;
  SaveTimes times_;
};

// DDP's bucket layout as state.json's "buckets": {"ready_order": [...], "first_bucket_bytes": N,
// "bucket_cap_bytes": N}. Reading checks it against a model of `params` parameters and throws
// "<source>: buckets.<field>: <problem>".
nlohmann::json bucket_layout_json(const BucketLayout& layout);
BucketLayout bucket_layout_from_json(const nlohmann::json& buckets, size_t params, const std::string& source);

// What a run resumes from: the state and the checkpoint it came from.
struct Resumed {
  checkpoint::TrainingState state;
  std::string path;  // DIR/step-<N>
  std::optional<BucketLayout> buckets;  // the layout the saving run had settled on, if any
  std::string chosen_because;  // why this checkpoint, when the directory had no `latest` ("" else)
};

// Restores `model`, `optimizer` and the model's Dropout counters from the checkpoint the
// settings name, read and validated by rank 0 and broadcast (without `latest`: the newest
// complete step-<N>, checkpoint::read_newest). nullopt when `--resume auto` finds no checkpoint.
// Every rank throws the same AgreedError (one line naming the file or the field: a config that
// differs, a damaged or missing file, an unknown format) when it does not fit. Collective over
// `control`.
std::optional<Resumed> restore_checkpoint(Communicator& control, const TrainConfig& config, Module& model,
                                          Optimizer& optimizer);

// Loads parameters from a safetensors file rank 0 reads (`--init-weights`): names, dtypes and
// shapes must match the model's exactly (one line naming the first mismatch, AgreedError on
// every rank). Collective over `control`.
void load_initial_weights(Communicator& control, const std::string& path, Module& model);

// The model.safetensors of a checkpoint, or `path` itself when it is a file, as rank 0 reads
// it, on every rank (for `dtrain eval`); `chosen_because` (when given) receives why that
// checkpoint, when the directory had no `latest`. Throws AgreedError.
safetensors::File read_weights_on_root(Communicator& control, const std::string& path,
                                       std::string* chosen_because = nullptr);

}  // namespace dtrain
