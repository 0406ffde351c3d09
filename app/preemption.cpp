#include "app/preemption.h"

#include <csignal>

#include <algorithm>
#include <atomic>

#include "comm/flight_recorder.h"

namespace dtrain {

namespace {

std::atomic<int> g_received{0};
static_assert(std::atomic<int>::is_always_lock_free, "read and written in a signal handler");

struct sigaction g_previous_term, g_previous_int, g_previous_usr1;

// SIGUSR1: every rank writes its flight recorder (its watchdog thread does the writing).
extern "C" void request_dump(int) { request_flight_recorder_dump(); }

extern "C" void record_stop_signal(int signal) {
  int none = 0;
  g_received.compare_exchange_strong(none, signal);
}

}  // namespace

StopSignals::StopSignals() {
  g_received.store(0);
  struct sigaction action {};
  action.sa_handler = record_stop_signal;
  sigemptyset(&action.sa_mask);
  // SA_RESETHAND: the second signal of a kind ends the process as it would have without us.
  // SA_RESTART: the training, loader and MPI threads carry on through the signal.
  action.sa_flags = SA_RESETHAND | SA_RESTART;
  sigaction(SIGTERM, &action, &g_previous_term);
  sigaction(SIGINT, &action, &g_previous_int);
  struct sigaction dump {};
  dump.sa_handler = request_dump;
  sigemptyset(&dump.sa_mask);
  dump.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &dump, &g_previous_usr1);
}

StopSignals::~StopSignals() {
  sigaction(SIGTERM, &g_previous_term, nullptr);
  sigaction(SIGINT, &g_previous_int, nullptr);
  sigaction(SIGUSR1, &g_previous_usr1, nullptr);
}

int StopSignals::received() { return g_received.load(); }

const char* signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    default: return "a signal";
  }
}

namespace {

// A ballot counts SIGTERMs in its low 16 bits and SIGINTs above, so that the sum over ranks says
// which signals arrived and every rank picks the same one (SIGTERM first: the scheduler's).
int32_t ballot_of(int signal) { return signal == SIGTERM ? 1 : signal != 0 ? 1 << 16 : 0; }
int signal_of(int32_t ballot) { return (ballot & 0xffff) != 0 ? SIGTERM : ballot != 0 ? SIGINT : 0; }

}  // namespace

int32_t vote_interval(double ms_per_step, double period_ms) {
  if (!(ms_per_step > 0) || !(period_ms > 0)) return 1;
  return static_cast<int32_t>(std::clamp(period_ms / ms_per_step, 1.0, static_cast<double>(kMaxVoteInterval)));
}

StopVote::StopVote(Communicator& control, double period_ms)
    : control_(control), period_ms_(period_ms), last_vote_ns_(steady_now_ns()) {}

bool StopVote::votes_here(bool force) {
  if (control_.size() == 1) return true;  // nothing to agree with: every boundary decides alone
  ++since_vote_;
  --until_vote_;
  return force || until_vote_ <= 0;
}

Verdict StopVote::cast(const Ballot& ballot) {
  if (control_.size() == 1) return {ballot.signal, ballot.nonfinite ? 1 : 0};
  const int64_t now = steady_now_ns();
  // A second vote at the same boundary measured no step: it keeps the interval.
  const int32_t next = since_vote_ == 0 ? interval_
                                        : vote_interval(static_cast<double>(now - last_vote_ns_) / 1e6 / since_vote_, period_ms_);
  // The sum of the ballots, rank 0's choice of the next interval (the others add 0), and the
  // number of ranks that saw a non-finite value.
  int32_t vote[3] = {ballot_of(ballot.signal), control_.rank() == 0 ? next : 0, ballot.nonfinite ? 1 : 0};
  control_.allreduce(vote, 3, DType::kI32, ReduceOp::kSum);
  ++votes_;
  interval_ = until_vote_ = std::max<int32_t>(vote[1], 1);
  since_vote_ = 0;
  last_vote_ns_ = now;
  return {signal_of(vote[0]), vote[2]};
}

}  // namespace dtrain
