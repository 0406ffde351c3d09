// What `dtrain train` puts into its checkpoints beyond the tensors, and the flags mapped onto the
// library's Checkpointer (train/checkpointer.h, which saves, restores and agrees on errors):
// the settings a resumed run must share, where the run stands, DDP's bucket layout.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include <nlohmann/json.hpp>

#include "app/train_config.h"
#include "checkpoint/training_state.h"
#include "comm/communicator.h"
#include "ddp/bucket_plan.h"
#include "ddp/distributed_data_parallel.h"
#include "model/module.h"
#include "model/optimizer.h"
#include "train/checkpointer.h"

namespace dtrain {

// The settings a resumed run must share with the run that saved the checkpoint (state.json's
// "config"): all that changes results — model, widths, dropout, optimizer and its
// hyper-parameters, LR schedule (with --epochs as the cosine period), batch size, accumulation,
// AMP, DDP buckets and comm hook, normalisation, shuffling, data limits, seed, gradient clipping;
// for --model gpt its shape (not the vocabulary: the tensors' shapes check it), --steps and the
// warm-up and --min-lr of its per-step schedule. Not in it, so free to change: a larger --epochs
// (other schedules), the data folder, device, threads, the world size (see Trainer), the
// evaluation settings and the output flags.
nlohmann::json resume_config(const TrainConfig& config);

// Where a run stands between two optimizer steps.
struct RunPosition {
  int64_t epoch = 0;            // the epoch in progress (or the next one, at an epoch end)
  int64_t step_in_epoch = 0;    // optimizer steps of it done
  int64_t sample_in_epoch = 0;  // global samples of it used: its position in the epoch's order
  int64_t global_step = 0;      // optimizer steps since the start
  int64_t samples_seen = 0;     // global samples since the start
};

// What state.json records of an image-model run at `pos` (per-epoch LR schedules, at `lr`): the
// position, world size, seed and resume_config(); the trainers add their own (DDP's buckets, the
// loss scale).
checkpoint::TrainingState position_state(const RunPosition& pos, const TrainConfig& config, int world_size, float lr);
// Where a checkpoint's state says the run stands, over an epoch of `train_samples`; throws
// Error (kCheckpoint) naming `source` (its state.json) when the position is past the epoch's end
// (a checkpoint of a larger data set, or an edited one).
RunPosition position_of(const checkpoint::TrainingState& state, int64_t train_samples, const std::string& source);

// Note [Resume layout]: a run resumed on another grid than the checkpoint's (another world size,
// or the same world size cut into other pipeline stages P x data-parallel replicas D) reads the
// same samples (slots), each once, but groups and sums them otherwise, so it is not bitwise the
// run it continues; the resume notes say so. The two layouts as the notes print them: the world
// size alone when neither run is a pipeline ("4"), else with its grid ("2 (P 2 x D 1)"); nullopt
// when the layouts are the same.
struct LayoutChange {
  std::string saved, running;
};
std::optional<LayoutChange> layout_change(const checkpoint::TrainingState& saved, int world_size, int pipeline_stages);
// An image-model run's note about resuming `saved` at another layout; "" at the same one.
std::string image_resume_layout_note(const checkpoint::TrainingState& saved, int world_size, int pipeline_stages);

// The library's Checkpointer (train/checkpointer.h) as the flags ask for it.
CheckpointerOptions checkpointer_options(const CheckpointSettings& settings);

// DDP's bucket layout as state.json's "buckets": {"ready_order": [...], "first_bucket_bytes": N,
// "bucket_cap_bytes": N}. Reading checks it against a model of `params` parameters and throws
// "<source>: buckets.<field>: <problem>".
nlohmann::json bucket_layout_json(const BucketLayout& layout);
BucketLayout bucket_layout_from_json(const nlohmann::json& buckets, size_t params, const std::string& source);

// What a run resumes from, with the bucket layout the saving run had settled on, if any.
struct ResumedRun : Resumed {
  std::optional<BucketLayout> buckets;
};

// Restores `model`, `optimizer` and the model's Dropout counters from the checkpoint the
// settings name (train/checkpointer.h: restore_newest for `--resume auto`, restore_from for a
// path), checking this run's resume_config() against the checkpoint's. nullopt when `--resume
// auto` finds no checkpoint. Every rank throws the same AgreedError (one line naming the file or
// the field) when it does not fit. With `ddp` (null on one rank) the checkpoint's bucket layout,
// if it saved one, is applied before any optimizer state is read: under ZeRO the shards follow
// the buckets (Note [ZeRO shards]), so this rank then asks for exactly its slices of that layout
// (train/optimizer_transfer.h), whatever world size or --zero the checkpoint was saved at.
// Collective over `control`.
// With `stage_of` (a pipeline: Note [Pipeline checkpoints] in train/checkpointer.h), `model` is
// this rank's stage of the model whose tensors are `stage_of.tensors`, and it asks for its own
// parameters' optimizer state and takes its own Dropout counters.
std::optional<ResumedRun> restore_checkpoint(Communicator& control, const TrainConfig& config, Module& model,
                                             Optimizer& optimizer, DistributedDataParallel* ddp = nullptr,
                                             const StageOf& stage_of = {});

}  // namespace dtrain
