// Preemption: SIGTERM or SIGINT asks the run to stop; every rank stops at the same step
// boundary, where rank 0 saves a checkpoint, and all exit with 128 + the signal's number.
//
// Note [Agreeing to stop]
//   A signal reaches the ranks at different moments (or only some of them: a scheduler may
//   signal one node first), so no rank may act on its own flag: a rank that stopped while the
//   others went on would leave them waiting in the next all-reduce. At every step boundary each
//   rank casts its flag into an all-reduce (sum) on the control communicator and all act on the
//   same result. The vote is asynchronous: the one cast at boundary k is read at boundary k+1,
//   so its latency hides behind a step and the ranks stop at most one step after the first
//   signal. Measured on the seed MLP, 2 ranks (README, "Checkpoints"): the per-step cost of the
//   blocking form was visible, the asynchronous one is within noise.
#pragma once

#include <cstdint>

#include "comm/communicator.h"

namespace dtrain {

// Installs handlers for SIGTERM and SIGINT that only record the signal (a second one of either
// takes its default action, so a user can still interrupt a run that does not stop); restores
// the previous handlers on destruction. One at a time per process.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal received (SIGTERM or SIGINT), 0 if none.
  static int received();
};

// "SIGTERM", "SIGINT", or the number.
const char* signal_name(int signal);

// The ranks' vote at each step boundary (Note [Agreeing to stop]). Every rank calls poll() at
// the same boundaries, in the same order relative to its other control collectives.
class StopVote {
 public:
  explicit StopVote(Communicator& control);
  ~StopVote();  // waits for the vote in flight
  StopVote(const StopVote&) = delete;
  StopVote& operator=(const StopVote&) = delete;

  // Casts this rank's vote (`local_signal`, 0 for none) and returns the signal the ranks agreed
  // to stop on at this boundary (the largest cast at the previous one), or 0 to go on.
  int poll(int local_signal);

 private:
  Communicator& control_;
  int32_t ballot_ = 0;  // all-reduced in place while a vote is in flight
  WorkHandle pending_;
};

}  // namespace dtrain
