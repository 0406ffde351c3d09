// The job monitor's rules (see job_monitor.h).
#include "launcher/job_monitor.h"

#include <signal.h>

#include <algorithm>
#include <map>

#include <fmt/format.h>

namespace dtrain::launcher {

// Note [Ending a job]
// The first thing that goes wrong is the cause, and the only one reported: a rank's failure, the
// start-up bound, or the user's interrupt. Everything after it is a consequence: when one rank
// dies, mpirun sends SIGTERM to the others (their supervisors mark them `stopped`), and a rank
// blocked on a dead peer may exit with an error of its own. Among failures, choose_cause prefers
// one that was not stopped and was killed by a signal, so the rank that died is named rather than
// the peer that noticed.
// Ending the job is mpirun's work first: after a rank failure Open MPI already sends SIGTERM and,
// a second later, SIGKILL to every rank. A SIGTERM to mpirun while it does so only prints "abort
// is already in progress" (and Open MPI 4.1 may crash in PMIx_Finalize), so after a rank failure
// dtrain-launch sends nothing unless mpirun is still running after mpirun_grace: then SIGKILL.
// For the start-up bound nobody else acts: SIGTERM at once (mpirun stops the ranks in order),
// SIGKILL after kill_grace. An interrupt is the ranks' to act on: dtrain train stops at a step
// boundary all ranks agree on and rank 0 saves a checkpoint (app/preemption.h), so the signal is
// passed to every rank through its supervisor's connection (on every node), not to mpirun: Open
// MPI 4.1, signalled, stops passing the ranks' output on at once (a rank that prints then blocks
// in write()), sends them SIGCONT, and SIGTERM and SIGKILL only odls_base_sigkill_timeout (1 s)
// and twice that later (measured), which with ranks that ignore the signal would take the job past
// 5 s. So a job still running stop_grace (--stop-timeout) after the interrupt ends as after a rank failure: SIGKILL
// to mpirun (the line then counts the ranks that had not ended); a second interrupt: SIGKILL now.
// Rank supervisors whose mpirun is killed die with it (parent-death signal) and take their
// programs along within a second, so after mpirun ends the monitor waits up to `drain` for every
// supervisor's connection to close: then no rank is left when dtrain-launch exits. Worst case
// from a rank's death to the end: mpirun_grace + drain (4.5 s with the defaults). Measured
// (tests/launcher): 1.1 s on one node; 2.3-3.5 s across two test-bed nodes, where Open MPI's
// abort reaches the other node's ranks a second later and mpirun sometimes outlives
// mpirun_grace. From an interrupt: 1.2-1.4 s for dtrain train's stop and save at np 2, 2.6 s
// across the bed (mpirun outlives its stopped ranks there), 3.6 s when the ranks ignore it.

JobMonitor::JobMonitor(int np, const MonitorTimings& timings, Clock::time_point started)
    : np_(np), t_(timings), started_(started), ranks_(static_cast<size_t>(std::max(np, 0))) {}

void JobMonitor::hello(int rank, const std::string& host, Clock::time_point) {
  if (rank < 0 || rank >= np_) return;
  RankState& r = ranks_[static_cast<size_t>(rank)];
  r.started = true;
  r.host = host;
}

void JobMonitor::reached_training(int rank, Clock::time_point) {
  if (rank >= 0 && rank < np_) ranks_[static_cast<size_t>(rank)].reached = true;
}

void JobMonitor::rank_exit(RankExit e, Clock::time_point now) {
  if (e.rank < 0 || e.rank >= np_) return;
  RankState& r = ranks_[static_cast<size_t>(e.rank)];
  r.reported_exit = true;
  r.reached = true;  // a rank that ended is not still starting
  e.host = r.host;
  if (!is_failure(e)) return;
  if (terminate_sent_ || kill_sent_) e.stopped = true;  // dtrain-launch had already begun to end the job
  failures_.push_back(std::move(e));
  record(Cause::kRankFailure, now);
}

void JobMonitor::supervisor_closed(int rank, Clock::time_point now) {
  if (rank < 0 || rank >= np_) return;
  RankState& r = ranks_[static_cast<size_t>(rank)];
  if (r.closed) return;
  r.closed = true;
  if (r.reported_exit) return;
  RankExit lost{rank, r.host, RankExit::How::kLost, 0, terminate_sent_ || kill_sent_ || mpirun_status_.has_value(), ""};
  r.reported_exit = r.reached = true;
  failures_.push_back(std::move(lost));
  record(Cause::kRankFailure, now);
}

void JobMonitor::interrupted(int signal, Clock::time_point now) {
  if (++interrupts_ > 1) {
    kill_at_ = now;  // asked twice: no more grace
    return;
  }
  interrupt_signal_ = signal;
  record(Cause::kInterrupt, now);
  if (terminate_sent_ || kill_sent_) return;  // already ending (the start-up bound)
  stop_at_ = now;
  if (!kill_at_ || *kill_at_ > now + t_.stop_grace) kill_at_ = now + t_.stop_grace;
}

int JobMonitor::stop_signal() const { return interrupt_signal_ == SIGINT ? SIGINT : SIGTERM; }

void JobMonitor::mpirun_exited(int status, Clock::time_point now) {
  if (mpirun_status_) return;
  mpirun_status_ = status;
  mpirun_exited_at_ = now;
}

void JobMonitor::record(Cause cause, Clock::time_point now) {
  if (cause_ != Cause::kNone) return;
  cause_ = cause;
  cause_at_ = now;
  if (cause == Cause::kRankFailure) kill_at_ = now + t_.mpirun_grace;
}

bool JobMonitor::all_reached() const {
  return std::all_of(ranks_.begin(), ranks_.end(), [](const RankState& r) { return r.reached; });
}

bool JobMonitor::supervisors_gone() const {
  return std::all_of(ranks_.begin(), ranks_.end(), [](const RankState& r) { return !r.started || r.closed; });
}

JobMonitor::Action JobMonitor::poll(Clock::time_point now) {
  if (mpirun_status_) {
    const bool drained = supervisors_gone() || now >= mpirun_exited_at_ + t_.drain;
    return drained ? Action::kFinish : Action::kWait;
  }
  const bool bounded = t_.start_timeout > Clock::duration::zero();
  if (cause_ == Cause::kNone && bounded && now >= started_ + t_.start_timeout && !all_reached()) {
    record(Cause::kStartTimeout, now);
    start_timeout_line_ = start_timeout_line();  // now: the ranks' ends would blur it
    terminate_at_ = now;
  }
  if (!stop_sent_ && stop_at_ && now >= *stop_at_) {
    stop_sent_ = true;
    return Action::kStopRanks;
  }
  const int running = static_cast<int>(
      std::count_if(ranks_.begin(), ranks_.end(), [](const RankState& r) { return !r.reported_exit && !r.closed; }));
  // Every rank has stopped after an interrupt, but mpirun lingers (across nodes it may): it gets
  // kill_grace, not what is left of --stop-timeout, which is the ranks' time to save.
  if (stop_sent_ && running == 0 && !kill_sent_ && (!kill_at_ || *kill_at_ > now + t_.kill_grace))
    kill_at_ = now + t_.kill_grace;
  if (!terminate_sent_ && !kill_sent_ && terminate_at_ && now >= *terminate_at_) {
    terminate_sent_ = true;
    running_when_ended_ = running;
    if (!kill_at_ || *kill_at_ > now + t_.kill_grace) kill_at_ = now + t_.kill_grace;
    return Action::kTerminate;
  }
  if (!kill_sent_ && kill_at_ && now >= *kill_at_) {
    kill_sent_ = true;
    if (!terminate_sent_) running_when_ended_ = running;
    return Action::kKill;
  }
  return Action::kWait;
}

Clock::time_point JobMonitor::next_deadline() const {
  if (mpirun_status_) return mpirun_exited_at_ + t_.drain;
  Clock::time_point next = Clock::time_point::max();
  if (cause_ == Cause::kNone && t_.start_timeout > Clock::duration::zero() && !all_reached())
    next = std::min(next, started_ + t_.start_timeout);
  if (!stop_sent_ && stop_at_) next = std::min(next, *stop_at_);
  if (!terminate_sent_ && !kill_sent_ && terminate_at_) next = std::min(next, *terminate_at_);
  if (!kill_sent_ && kill_at_) next = std::min(next, *kill_at_);
  return next;
}

std::string JobMonitor::start_timeout_line() const {
  std::vector<StartState> states;
  for (const RankState& r : ranks_)
    states.push_back({r.started ? std::optional<std::string>(r.host) : std::nullopt, r.reached});
  return describe_start_timeout(std::chrono::duration<double>(t_.start_timeout).count(), states);
}

JobOutcome JobMonitor::outcome() const {
  JobOutcome o;
  switch (cause_) {
    case Cause::kRankFailure: {
      const RankExit& cause = failures_[choose_cause(failures_)];
      return {JobOutcome::Kind::kRankFailed, exit_status(cause), describe_rank_exit(cause)};
    }
    case Cause::kStartTimeout: return {JobOutcome::Kind::kStartTimeout, 124, start_timeout_line_};
    case Cause::kInterrupt: {
      // The ranks stopped on their own (dtrain train: after its checkpoint) unless some were
      // still running when mpirun was killed stop_grace later (across nodes mpirun itself may
      // outlive its ranks that long: then only mpirun is killed).
      std::string how = fmt::format("all {} rank(s) stopped", np_);
      if (running_when_ended_ > 0 && interrupts_ > 1)
        how = fmt::format("passed to all {} rank(s); a second signal killed the {} still running", np_,
                          running_when_ended_);
      else if (running_when_ended_ > 0)
        how = fmt::format("passed to all {} rank(s); {} had not stopped {:g} s later: killed", np_, running_when_ended_,
                          std::chrono::duration<double>(t_.stop_grace).count());
      return {JobOutcome::Kind::kInterrupted, 128 + interrupt_signal_,
              fmt::format("interrupted by {}: {}", signal_name(interrupt_signal_), how)};
    }
    case Cause::kNone: break;
  }
  const int status = mpirun_status_.value_or(1);
  if (status == 0) return o;
  std::vector<int> missing;
  for (int r = 0; r < np_; ++r)
    if (!ranks_[static_cast<size_t>(r)].started) missing.push_back(r);
  std::string line = fmt::format("mpirun exited with status {}", status);
  if (!missing.empty())
    line += fmt::format(" before rank{} {} started", missing.size() > 1 ? "s" : "", format_ranks(missing));
  return {JobOutcome::Kind::kMpirunFailed, status, line};
}

std::string describe_start_timeout(double timeout_s, const std::vector<StartState>& ranks) {
  std::map<std::string, std::vector<int>> starting;  // host -> ranks that started but did not reach training
  std::vector<int> never;
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    const StartState& s = ranks[static_cast<size_t>(r)];
    if (s.reached) continue;
    if (s.host) {
      starting[*s.host].push_back(r);
    } else {
      never.push_back(r);
    }
  }
  auto ranks_word = [](const std::vector<int>& list) { return list.size() > 1 ? "ranks" : "rank"; };
  std::string line = fmt::format("start-up took longer than {:g} s (--start-timeout):", timeout_s);
  std::string sep = " ";
  for (const auto& [host, list] : starting) {
    line += fmt::format("{}{} {} on {}", sep, ranks_word(list), format_ranks(list), host.empty() ? "an unknown host" : host);
    sep = ", ";
  }
  if (!starting.empty()) line += " did not reach training";
  if (!never.empty())
    line += fmt::format("{}{} {} never started", starting.empty() ? " " : "; ", ranks_word(never), format_ranks(never));
  return line + " (across nodes, the usual cause is MPI using a network the nodes cannot reach each other on: "
                "--iface picks one)";
}

}  // namespace dtrain::launcher
