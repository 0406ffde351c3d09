// Checkpointing a data-parallel run through the library: a Checkpointer saves a model, its
// optimizer and a TrainingState (where the run stands, settings a resumed run must share) into
// a checkpoint directory, atomically and on a background thread (layout and guarantees: Note
// [Checkpoint layout] in checkpoint/checkpoint_layout.h); restore_*() read one back on every
// rank from what rank 0 read (train/root_broadcast.h: no shared filesystem needed). Every
// failure a rank could see alone (a damaged file, a config that differs, a non-finite value, a
// directory another job holds) is the same AgreedError on every rank: the ranks stop alike.
//
//   Checkpointer ckpt(rt->control(), {.dir = "ckpt"});
//   if (auto resumed = ckpt.restore_latest(model, sgd)) step = resumed->state.global_step;
//   ...
//   if (step % 100 == 0) ckpt.save(state, model, sgd);  // returns once the snapshot is taken
//   ...
//   ckpt.finish();  // the last save written (or its error, on every rank)
//
// `dtrain train` (app/trainer.cpp) uses the parts of save() apart: snapshot(), its own vote
// (which also carries signals and losses, Note [Stopping on non-finite values]), write().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_layout.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/training_state.h"
#include "comm/communicator.h"
#include "model/module.h"
#include "model/optimizer.h"
#include "train/optimizer_transfer.h"

// Note [Pipeline checkpoints]: a pipeline's checkpoint is an ordinary one (Note [Checkpoint
// layout]): one model.safetensors under the unsplit model's names, its parameters and buffers
// (BatchNorm's running statistics, replica 0's), so PyTorch, `dtrain eval` and a run at any
// P x D (P = 1 included) load it; the optimizer state in the sharded form of Note
// [Sharded optimizer state], one file per rank, each stage's replica 0 holding its stage's
// tensors whole and the other replicas' files empty (under ZeRO, Note [Pipeline ZeRO-1] in
// app/pipeline_zero.h, every replica's file holds its slices of its stage's state); a parameter
// two stages hold (the GPT's tied wte, Note [Tied stages] in pipeline/pipeline_stage.h) is saved
// once, with its state, by the lower stage. Saving, every tensor streams to rank 0 in
// chunks (the model from the lowest rank that holds it), so no rank holds more than its stage
// and a chunk. Restoring a stage, rank 0 reads the checkpoint (validated whole, as any resume)
// and sends the model's tensors one at a time; each stage asks for its own parameters'
// optimizer state (wanted_pieces), which any checkpoint, sharded or not, serves.
namespace dtrain {

namespace checkpoint {
class CheckpointWriter;
class DirectoryLock;
struct CheckpointSnapshot;
}  // namespace checkpoint

// A pipeline stage being restored (Note [Pipeline checkpoints]): the unsplit model's tensors,
// and where the stage's Dropout counters lie in the unsplit model's list (Note [Pipeline
// dropout] in pipeline/pipeline_stage.h): `whole_counters` in all, the stage's from
// `first_counter` on.
struct StageOf {
  StageOf() = default;
  StageOf(std::span<const safetensors::TensorSpec> tensors_, size_t first_counter_ = 0, size_t whole_counters_ = 0)
      : tensors(tensors_), first_counter(first_counter_), whole_counters(whole_counters_) {}
  std::span<const safetensors::TensorSpec> tensors;  // empty: not a stage
  size_t first_counter = 0, whole_counters = 0;
};

struct CheckpointerOptions {
  std::string dir;                      // the checkpoint directory; empty: nothing is saved
  int keep = checkpoint::kDefaultKeep;  // newest checkpoints kept, >= 1
  bool background = true;               // written on a background thread while training goes on
  // Ends the line of a directory another job holds: the caller's words for the rule (the CLI
  // names its flag).
  std::string in_use_hint = "one job per checkpoint directory";
  // The most bytes of sharded optimizer state a rank sends to rank 0 at once.
  size_t transfer_chunk_bytes = checkpoint::kStreamChunkBytes;
};

// How long saving held training up, for a run's closing checkpoint line.
struct SaveTimes {
  std::vector<double> blocked_ms;     // per save, in all: the three below
  std::vector<double> previous_ms;    // waiting for the previous save to be written
  std::vector<double> snapshot_ms;    // copying parameters and optimizer state to host buffers
  std::vector<double> write_ms;       // writing, when synchronous
  std::vector<double> step_ms_while_writing, step_ms_otherwise;  // optimizer-step durations
};

// What a run resumes from: the state and the checkpoint it came from.
struct Resumed {
  checkpoint::TrainingState state;
  std::string path;            // DIR/step-<N>
  std::string chosen_because;  // why this checkpoint, when the directory had no `latest` ("" else)
};

// Saves checkpoints. Only rank 0 (replicas are identical) writes, and from its start to its end
// it holds the lock of the directory (checkpoint/directory_lock.h), taken before anything reads
// it. An optimizer whose ranks export different parts of the state (ZeRO: agree_sharded) is
// saved in shards, one per rank (Note [Sharded optimizer state]): the other ranks stream theirs
// to rank 0 during write(), which is then collective and waits for the shards; the model and
// state.json are still written in the background.
class Checkpointer {
 public:
  // Collective over `control`: a directory another job holds is the same AgreedError on every
  // rank ("DIR is in use by another dtrain job (pid P on HOST, since T); <in_use_hint>").
  Checkpointer(Communicator& control, CheckpointerOptions options);
  // Waits for a save in flight (an error nobody collected is printed to stderr).
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Collective: snapshots `model` and `optimizer` with `state` (its global_step names the
  // checkpoint, step-<N>; training may change the tensors once this returns; on a GPU the caller
  // has synchronised the compute stream) and writes it, in the background unless the options
  // say otherwise. `metadata` goes into model.safetensors' __metadata__. Throws AgreedError on
  // every rank, with nothing written, when the snapshot holds a NaN or an infinity, or when an
  // earlier save failed.
  void save(checkpoint::TrainingState state, Module& model, const Optimizer& optimizer,
            const safetensors::Metadata& metadata = {});
  // Collective: waits for the save in flight; its error is an AgreedError on every rank.
  void finish();
  // Collective, Note [Pipeline checkpoints]: saves a pipeline's checkpoint, `stage` being this
  // rank's stage of the model whose tensors are `whole` (names, shapes, in the unsplit model's
  // order), `seat` its place in the grid. Replica 0 of each stage holds the stage: its parameters
  // and buffers go into the one model.safetensors and its optimizer state into its shard; the other
  // replicas' shards are empty, or, when the optimizer updates only a part of the stage (ZeRO:
  // Note [Pipeline ZeRO-1] in app/pipeline_zero.h), each replica's shard holds its slices.
  // The model and the shards are streamed to rank 0 while training waits; state.json follows in
  // the background unless the options say otherwise. Errors as save()'s.
  struct StageSeat {
    int stage = 0, replica = 0;
  };
  void save_stage(checkpoint::TrainingState state, Module& stage, const Optimizer& optimizer, StageSeat seat,
                  std::span<const safetensors::TensorSpec> whole, const safetensors::Metadata& metadata = {});
  // Collective: restore_newest() of this directory (nullopt when it holds no checkpoint).
  std::optional<Resumed> restore_latest(Module& model, Optimizer& optimizer, const nlohmann::json& config = nullptr,
                                        const WantedPieces& pieces = std::nullopt);

  // save()'s parts. snapshot() (collective: the ranks agree whether the optimizer state is
  // sharded, agree_sharded) takes the snapshot after the previous save is written, and returns the snapshot's first tensor holding a NaN or an infinity ("<file>:
  // <tensor>: <count> non-finite value(s) ..."), "" when all are finite or this rank does not
  // write (with sharded state every rank checks its own slices); it throws the error of an
  // earlier save. `state.rng` may carry the caller's RNG state; the Checkpointer adds the model's
  // Dropout counters as "dropout_counters". With sharded state the snapshot keeps views of the
  // optimizer's slices, so no optimizer step may run before write() or discard().
  std::string snapshot(checkpoint::TrainingState state, Module& model, const Optimizer& optimizer,
                       const safetensors::Metadata& metadata);
  // Writes the snapshot, on the background thread unless the options say otherwise. Collective
  // when the snapshot holds sharded state (every rank's shard moves to rank 0 first; an error is
  // the same AgreedError on every rank); else rank 0's alone.
  void write();
  // Drops the snapshot unwritten.
  void discard();
  // Waits for the save in flight; throws its error.
  void wait();

  const CheckpointerOptions& options() const { return options_; }
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
  Communicator& control_;
  CheckpointerOptions options_;
  std::unique_ptr<checkpoint::DirectoryLock> lock_;         // rank 0 only; outlives writer_
  std::unique_ptr<checkpoint::CheckpointWriter> writer_;    // rank 0 only
  std::unique_ptr<checkpoint::CheckpointSnapshot> pending_;  // taken, not yet written
  std::optional<OptimizerState> pending_shards_;  // every rank: its slices (views), not yet sent
  safetensors::Metadata pending_shard_metadata_;
  int64_t pending_step_ = 0;
  void write_sharded();
  double pending_previous_ms_ = 0, pending_snapshot_ms_ = 0;
  std::string last_path_;
  SaveTimes times_;
};

// Restores `model`, `optimizer` and the model's Dropout counters from the newest checkpoint of
// directory `dir` (the one `latest` names; without it, the newest complete step-<N>), read and
// validated by rank 0 and broadcast; nullopt when `dir` holds none. `config`, unless null, must
// equal the checkpoint's state.config (checkpoint::first_config_difference). Every rank throws
// the same AgreedError (one line naming the file or the field: a config that differs, a damaged
// or missing file, an unknown format, a non-finite value) when it does not fit. Collective.
// The optimizer state moves in chunks (train/optimizer_transfer.h): `pieces` are this rank's
// slices for a ZeRO optimizer, nullopt for every tensor whole; the checkpoint's state may be
// sharded at any count or not at all.
std::optional<Resumed> restore_newest(Communicator& control, const std::string& dir, Module& model,
                                      Optimizer& optimizer, const nlohmann::json& config = nullptr,
                                      const WantedPieces& pieces = std::nullopt);
// The same from `path`: a checkpoint (DIR/step-<N>) or a checkpoint directory, which must hold
// one.
Resumed restore_from(Communicator& control, const std::string& path, Module& model, Optimizer& optimizer,
                     const nlohmann::json& config = nullptr, const WantedPieces& pieces = std::nullopt);
// The same, the pieces decided once the checkpoint's training state is read, before any
// optimizer state moves (ZeRO: the run first takes the bucket layout the checkpoint saved, and
// its shards of that layout are the pieces it asks for). Called on every rank with the same
// checkpoint.
using PiecesFor = std::function<WantedPieces(const Resumed&)>;
// With `stage_of` (Note [Pipeline checkpoints]): `model` is a pipeline stage of the model whose
// tensors are `stage_of.tensors`; the checkpoint's model.safetensors must hold exactly those, its
// state.json the whole model's Dropout counters (the stage takes its own), and rank 0
// sends them one at a time, each rank keeping its stage's.
std::optional<Resumed> restore_newest(Communicator& control, const std::string& dir, Module& model,
                                      Optimizer& optimizer, const nlohmann::json& config, const PiecesFor& pieces_for,
                                      const StageOf& stage_of = {});
Resumed restore_from(Communicator& control, const std::string& path, Module& model, Optimizer& optimizer,
                     const nlohmann::json& config, const PiecesFor& pieces_for,
                     const StageOf& stage_of = {});

// Loads parameters from a safetensors file rank 0 reads: names, dtypes and shapes must match
// the model's exactly (one line naming the first mismatch, AgreedError on every rank).
// Collective.
void load_initial_weights(Communicator& control, const std::string& path, Module& model);
// The same for a pipeline stage (Note [Stage construction] in model/models.h): the file must hold
// exactly the whole model's tensors `whole`; rank 0 reads and sends them one at a time and each
// rank keeps its stage's, so no rank holds more than its stage and one tensor. Collective.
void load_stage_weights(Communicator& control, const std::string& path, Module& stage,
                        std::span<const safetensors::TensorSpec> whole);

// The model.safetensors of a checkpoint, or `path` itself when it is a file, as rank 0 reads
// it, on every rank; `chosen_because` (when given) receives why that checkpoint, when the
// directory had no `latest`. Throws AgreedError. Collective.
safetensors::File read_weights_on_root(Communicator& control, const std::string& path,
                                       std::string* chosen_because = nullptr);

}  // namespace dtrain
