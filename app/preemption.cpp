#include "app/preemption.h"

#include <csignal>

#include <atomic>

namespace dtrain {

namespace {

std::atomic<int> g_received{0};
static_assert(std::atomic<int>::is_always_lock_free, "read and written in a signal handler");

struct sigaction g_previous_term, g_previous_int;

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
}

StopSignals::~StopSignals() {
  sigaction(SIGTERM, &g_previous_term, nullptr);
  sigaction(SIGINT, &g_previous_int, nullptr);
}

int StopSignals::received() { return g_received.load(); }

const char* signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    default: return "a signal";
  }
}

StopVote::StopVote(Communicator& control) : control_(control) {}

StopVote::~StopVote() {
  if (!pending_) return;
  try {
    pending_->wait();
  } catch (...) {  // the run is failing already; its own error says why
  }
}

// A ballot counts SIGTERMs in its low 16 bits and SIGINTs above, so that the sum over ranks says
// which signals arrived and every rank picks the same one (SIGTERM first: the scheduler's).
namespace {
int32_t ballot_of(int signal) { return signal == SIGTERM ? 1 : signal != 0 ? 1 << 16 : 0; }
int signal_of(int32_t ballot) { return (ballot & 0xffff) != 0 ? SIGTERM : ballot != 0 ? SIGINT : 0; }
}  // namespace

int StopVote::poll(int local_signal) {
  if (control_.size() == 1) return local_signal;  // nothing to agree with: stop at once
  int32_t agreed = 0;
  if (pending_) {
    pending_->wait();
    pending_.reset();
    agreed = ballot_;
  }
  if (agreed != 0) return signal_of(agreed);
  ballot_ = ballot_of(local_signal);
  pending_ = control_.allreduce_async(&ballot_, 1, DType::kI32, ReduceOp::kSum);
  return 0;
}

}  // namespace dtrain
