// Preemption: SIGTERM or SIGINT asks the run to stop; every rank stops at the same step
// boundary, where rank 0 saves a checkpoint, and all exit with 128 + the signal's number.
//
// Note [Agreeing to stop]
//   A signal reaches the ranks at different moments (or only some of them: a scheduler may
//   signal one node first), so no rank may act on its own flag: a rank that stopped while the
//   others went on would leave them waiting in the next all-reduce. The ranks vote instead, in a
//   small blocking all-reduce on the control communicator at the same step boundaries, and all
//   act on its sum. Measured on the seed MLP at 2 ranks (30000 samples, best of 12 runs each,
//   on a 2-core machine shared with other work, so only the best runs mean anything): a vote at
//   every boundary cost 0 to 5% of a step (1.14-1.18 ms against 1.12-1.14 ms without, two
//   series); an asynchronous vote, cast at one boundary and read at the next, cost far more
//   (1.84 ms: the communication thread polls for the late peer while the compute thread needs
//   the core). So the vote is blocking, and the ranks vote about every kVotePeriodMs (measured:
//   1.11 ms per step, within the noise of no vote at all): rank 0 measures the time per step
//   and sends, with each vote's result, how many boundaries pass until the next vote; every
//   rank counts them alike. A stop comes within kVotePeriodMs plus a step of the signal.
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

// The period between two votes, and the number of step boundaries that spans given the time a
// step takes (at least 1, at most kMaxVoteInterval). Pure.
inline constexpr double kVotePeriodMs = 50;
inline constexpr int32_t kMaxVoteInterval = 10'000;
int32_t vote_interval(double ms_per_step, double period_ms);

// What a rank brings to a vote, and what the ranks agreed.
struct Ballot {
  int signal = 0;          // SIGTERM or SIGINT received, 0 for none
  bool nonfinite = false;  // this rank saw a NaN or an infinity (Note [Stopping on non-finite values])
};
struct Verdict {
  int signal = 0;           // the signal to stop on (SIGTERM when any rank got one, else SIGINT); 0: none
  int nonfinite_ranks = 0;  // how many ranks saw a non-finite value; > 0: every rank stops
};

// The ranks' vote at step boundaries (Note [Agreeing to stop]). Every rank calls poll(), or
// votes_here() and then cast() when it says so, at the same boundaries, in the same order
// relative to its other control collectives.
class StopVote {
 public:
  // period_ms 0: a vote at every boundary.
  explicit StopVote(Communicator& control, double period_ms = kVotePeriodMs);

  // At a boundary: whether the ranks vote here. `force`: a boundary where they must (a
  // checkpoint is due, or the run ends), the same on every rank; it starts a new period.
  bool votes_here(bool force = false);
  // Casts this rank's ballot (at a boundary where votes_here() said so, or again at the same
  // boundary, by every rank) and returns what the ranks agreed. One rank: its own ballot.
  Verdict cast(const Ballot& ballot);
  // votes_here() and cast() of a signal alone: the signal to stop on, 0 to go on.
  int poll(int local_signal) { return votes_here() ? cast({local_signal, false}).signal : 0; }
  int64_t votes() const { return votes_; }

 private:
  Communicator& control_;
  double period_ms_;
  int32_t interval_ = 1;    // boundaries from one vote to the next, as rank 0 chose it
  int32_t until_vote_ = 1;  // boundaries left until the next vote
  int32_t since_vote_ = 0;  // boundaries since the last vote (a forced vote comes early)
  int64_t votes_ = 0;
  int64_t last_vote_ns_;
};

}  // namespace dtrain
