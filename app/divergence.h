// Divergence: a loss, parameter or optimizer value that is no longer finite ends the run.
//
// Note [Stopping on non-finite values]
//   A NaN or an infinity never goes away by training on: every step after it is wasted, and a
//   checkpoint written from it replaces (and, with --keep, prunes) the last good ones. So:
//   - every rank checks its loss at every step (LossWatch): on a CPU the loss is a host float,
//     read for free; on a GPU reading it would synchronise every step, so the step losses are
//     summed on the device (a sum stays non-finite once one term is) and the sum is read at
//     votes at most once a period (on one rank every boundary votes) and always before a save,
//     naming the range of steps;
//   - the finding goes into the stop vote (app/preemption.h), so every rank stops at the same
//     boundary and none is left waiting in a collective; the ranks then exchange what each saw
//     and rank 0 prints one line (divergence_line());
//   - at a boundary where a checkpoint is due (the same on every rank) the ranks always vote,
//     after rank 0 has taken the snapshot and checked it (parameters and optimizer state: NaN
//     weights can give a finite loss, as ReLU(NaN) is 0); the snapshot is written only when no
//     rank saw anything; the run's end is always a vote too;
//   - every rank exits with kDivergedExitStatus; the checkpoints already written stay as they
//     are (dtrain-launch does not restart on it: a resumed run would diverge the same way);
//   - the checkpoint writer refuses non-finite tensors by itself (checkpoint/finite.h), and
//     --init-weights and resuming refuse them, naming the file and the tensor.
//   The gradient norm is not checked on the host (--clip-grad-norm keeps it on the device): a
//   non-finite gradient (or norm, through the clip coefficient) reaches the parameters in the
//   same step and the loss (or the snapshot check) in the next.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>

#include "core/exit_status.h"
#include "core/tensor.h"

namespace dtrain {

// The exit status of every rank of a run that stopped on a non-finite value.
inline constexpr int kDivergedExitStatus = kExitDiverged;

// Where a micro-batch ran: the optimizer step it belongs to (from 1, over the whole run), its
// epoch (from 0) and its batch in the epoch (from 1, as an uninterrupted run counts them).
struct StepPlace {
  int64_t step = 0;
  int64_t epoch = 0;
  int64_t batch = 0;
};

// What a rank saw of its losses (trivially copyable: the ranks exchange it).
struct LossFinding {
  bool found = false;
  bool exact = true;  // `first` is the step whose loss it is; else one of first..last (a device sum)
  float value = 0;    // the non-finite loss (or sum)
  StepPlace first, last;
};

// One rank's watch over its step losses (Note [Stopping on non-finite values]).
class LossWatch {
 public:
  // `read_every_step`: read each loss as it comes (a CPU loss); else sum them on `device` and
  // read the sum at most every `read_period_ms` unless a check must.
  LossWatch(Device device, bool read_every_step, double read_period_ms = 0);
  // After each micro-batch: its loss (a one-element tensor on the device) and where it ran.
  void record(const Tensor& loss, const StepPlace& at);
  // At a vote: the first non-finite loss seen so far (kept once found). On a device, reads
  // the sum of the losses recorded since the last read (one float: a synchronisation) when
  // `must` (before a save, at the end) or a period has passed since the last read.
  LossFinding check(bool must = true);

 private:
  bool read_every_step_;
  double read_period_ms_;
  std::chrono::steady_clock::time_point last_read_;
  Tensor sum_;                  // the device-side running sum (when not read every step)
  StepPlace first_unchecked_;   // the first step in sum_
  StepPlace last_recorded_;
  bool unchecked_ = false;      // sum_ holds a loss not yet read
  LossFinding found_;
};

// The line (without "dtrain: error: ") of a run that stopped on a non-finite value at `step`:
// what went non-finite (the earliest loss among `per_rank`, indexed by rank, naming the ranks
// that saw one; else the snapshot's `tensor` problem from checkpoint/finite.h), where, and
// what became of the checkpoints (`checkpoints`).
std::string divergence_line(std::span<const LossFinding> per_rank, const std::string& tensor, const StepPlace& step,
                            const std::string& checkpoints);

}  // namespace dtrain
