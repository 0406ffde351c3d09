// RunControl: what happens between two optimizer steps of a `dtrain train` run, whatever the
// model: the ranks' vote (a signal, a non-finite loss or tensor: Note [Agreeing to stop], Note
// [Stopping on non-finite values]), checkpoints (train/checkpointer.h) when due, the stop and
// divergence lines. The image loop (app/trainer.cpp) and the language-model loop
// (app/lm_trainer.cpp) each tell it where they stand; it decides and acts alike on every rank.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "app/checkpointing.h"
#include "app/divergence.h"
#include "app/preemption.h"
#include "app/reporter.h"
#include "app/trace.h"
#include "app/train_config.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/training_state.h"
#include "comm/runtime.h"
#include "ddp/distributed_data_parallel.h"
#include "model/module.h"
#include "model/optimizer.h"
#include "train/checkpointer.h"

namespace dtrain {

// A boundary between two optimizer steps, as the loop sees it.
struct Boundary {
  int64_t global_step = 0;  // optimizer steps done
  bool run_end = false;     // the last one of the run: a checkpoint is due (with a directory), and a vote
  bool due = false;         // a checkpoint is due by the loop's schedule (--checkpoint-every, epoch ends)
  bool can_save = true;     // a checkpoint here could be resumed from (not inside an uneven epoch)
};

class RunControl {
 public:
  // The run's position: the training state a snapshot saves, and the stop line's "at step 12
  // (epoch 1, 640 samples into it)".
  struct Callbacks {
    std::function<checkpoint::TrainingState()> state;
    std::function<std::string()> where;
    std::string no_save_here;  // the stop line when a stop comes where no checkpoint can be saved
  };
  // Collective (the Checkpointer takes its directory's lock).
  RunControl(Runtime& runtime, const TrainConfig& config, Module& model, const Optimizer& optimizer,
             Reporter& reporter, safetensors::Metadata architecture, Callbacks callbacks);

  // Where the run starts: a checkpoint (--resume, into the model and `optimizer`), else given
  // weights (--init-weights, into the model), else nullopt and the seeded initialisation. Reads
  // everything that can fail before anything is printed: a checkpoint that does not fit is the
  // run's only line (a checkpoint error). Collective.
  // With `ddp` (null on one rank) a checkpoint's bucket layout is applied before the optimizer
  // state is read (restore_checkpoint: under ZeRO the shards follow it).
  std::optional<ResumedRun> read_starting_point(Optimizer& optimizer, DistributedDataParallel* ddp);
  // After the run's opening line: notes where it starts; from a checkpoint, notes the bucket
  // layout `ddp` (null on one rank) took from it and remembers the checkpoint as the newest.
  void announce_start(const std::optional<ResumedRun>& resumed, DistributedDataParallel* ddp);
  // Around each optimizer step: its first micro-batch starts, a micro-batch's loss, the step ends.
  void begin_step();
  void record_loss(const Tensor& loss, const StepPlace& at) { loss_watch_.record(loss, at); }
  void end_step(const StepPlace& at);
  // Votes when due, saves when due, stops or diverges; false when the ranks agreed to stop here.
  bool at_step_boundary(const Boundary& b);
  // The end of the run: a failed background save fails here; the checkpoints' closing line.
  void finish();
  // With --trace (`tracer` enabled): writes the trace (a collective: rank 0 writes every rank's
  // spans), tells the user, and sets result.allreduce_overlap to the share of all-reduce time
  // inside backward. Nothing without it.
  void write_trace(const Tracer& tracer, TrainResult& result);

  int stopped_by() const { return stopped_by_; }
  bool diverged() const { return diverged_; }
  const Checkpointer& saver() const { return saver_; }

 private:
  Verdict vote(bool snapshot, bool must_read, bool check_parameters = false);
  void write_checkpoint(int64_t global_step);
  void stop(int signal, int64_t global_step);
  void diverge();

  Runtime& rt_;
  const TrainConfig& c_;
  Module& model_;
  const Optimizer& optimizer_;
  Reporter& reporter_;
  safetensors::Metadata architecture_;
  Callbacks callbacks_;
  Checkpointer saver_;
  int64_t last_saved_step_ = -1;
  StopSignals signals_;
  StopVote stop_vote_;
  LossWatch loss_watch_;
  StepPlace last_step_;            // where the last optimizer step ran
  std::string snapshot_problem_;   // rank 0: the non-finite tensor of the last snapshot, "" if none
  std::string newest_checkpoint_;  // resumed from or saved, "" if none
  std::chrono::steady_clock::time_point step_start_;
  bool writing_ = false;  // a background save was being written when the step started
  int stopped_by_ = 0;    // the signal the ranks agreed to stop on
  bool diverged_ = false;
};

}  // namespace dtrain
