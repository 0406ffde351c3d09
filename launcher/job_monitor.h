// JobMonitor: dtrain-launch's decisions while one mpirun job runs, as a pure state machine fed
// with what happened (a rank supervisor said hello, reached training, reported its program's
// exit or went away; the user interrupted; mpirun ended) and asked what to do now (nothing,
// pass the interrupt to the ranks, SIGTERM mpirun, SIGKILL mpirun, finish) and when to ask
// again. The outcome names the one cause of a failure. Time is passed in, so every rule is
// tested without processes or clocks.
// See Note [Ending a job] in job_monitor.cpp.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "launcher/rank_exit.h"

namespace dtrain::launcher {

using Clock = std::chrono::steady_clock;

struct JobOutcome {
  enum class Kind {
    kSucceeded,
    kRankFailed,    // a rank's program failed (signal, non-zero exit, supervisor gone)
    kStartTimeout,  // not every rank reached training within the start-up bound
    kInterrupted,   // SIGINT, SIGTERM, SIGHUP or SIGQUIT to dtrain-launch
    kMpirunFailed,  // mpirun failed with no rank failure reported (e.g. it could not start them)
  };
  Kind kind = Kind::kSucceeded;
  int exit_status = 0;
  std::string cause;  // one line, without "dtrain-launch: "; "" on success
};

struct MonitorTimings {
  Clock::duration start_timeout = std::chrono::seconds(0);  // 0: start-up is not bounded
  // After a rank fails, mpirun ends the job itself (Open MPI: SIGTERM to the other ranks, SIGKILL
  // one second later; measured 1.3 s at -np 2 and 2.3 s at -np 1). dtrain-launch kills mpirun
  // only if it is still running after this long.
  Clock::duration mpirun_grace = std::chrono::milliseconds(3000);
  // After an interrupt has been passed to the ranks: how long they get to stop on their own
  // (dtrain train: the stop vote, rank 0's checkpoint, the exit) before dtrain-launch SIGKILLs
  // mpirun's process group, so that a job whose ranks ignore the signal still ends
  // (--stop-timeout; 30 s by default, as Slurm's KillWait: a large model's save takes seconds).
  Clock::duration stop_grace = std::chrono::seconds(30);
  // After dtrain-launch's own SIGTERM to mpirun (start-up bound, interrupt), before SIGKILL.
  Clock::duration kill_grace = std::chrono::milliseconds(2000);
  // After mpirun ends: how long to wait for supervisors' last reports and for them to be gone
  // (a supervisor whose mpirun was killed stops its program within a second).
  Clock::duration drain = std::chrono::milliseconds(1500);
};

class JobMonitor {
 public:
  enum class Action { kWait, kStopRanks, kTerminate, kKill, kFinish };

  JobMonitor(int np, const MonitorTimings& timings, Clock::time_point started);

  void hello(int rank, const std::string& host, Clock::time_point now);
  void reached_training(int rank, Clock::time_point now);
  // The program of `e.rank` ended (host filled in from its hello).
  void rank_exit(RankExit e, Clock::time_point now);
  // The supervisor's connection closed: without an exit report first, the rank is lost.
  void supervisor_closed(int rank, Clock::time_point now);
  // dtrain-launch received `signal` (SIGINT, SIGTERM, SIGHUP or SIGQUIT).
  void interrupted(int signal, Clock::time_point now);
  void mpirun_exited(int status, Clock::time_point now);

  // What to do now. kStopRanks (send stop_signal() to every rank), kTerminate and kKill are
  // each returned once; kFinish once the outcome is known and nothing is left to wait for.
  Action poll(Clock::time_point now);
  // The signal the ranks are to get after an interrupt: SIGINT for SIGINT, else SIGTERM (the
  // signals dtrain train stops on).
  int stop_signal() const;
  // When poll may next have something to do (time_point::max(): only on a new event).
  Clock::time_point next_deadline() const;
  JobOutcome outcome() const;

 private:
  enum class Cause { kNone, kRankFailure, kStartTimeout, kInterrupt };
  struct RankState {
    bool started = false;  // its supervisor said hello
    bool reached = false;  // reached training, or ended
    bool reported_exit = false;
    bool closed = false;
    std::string host;
  };
  void record(Cause cause, Clock::time_point now);
  bool all_reached() const;
  bool supervisors_gone() const;
  std::string start_timeout_line() const;

  int np_;
  MonitorTimings t_;
  Clock::time_point started_;
  std::vector<RankState> ranks_;
  std::vector<RankExit> failures_;  // in arrival order
  Cause cause_ = Cause::kNone;      // the first thing that went wrong
  Clock::time_point cause_at_{};
  int interrupts_ = 0;
  int interrupt_signal_ = 0;  // the first one
  std::optional<Clock::time_point> stop_at_, terminate_at_, kill_at_;  // when to send them
  bool stop_sent_ = false, terminate_sent_ = false, kill_sent_ = false;
  int running_when_ended_ = 0;  // ranks not yet ended when mpirun had to be signalled
  std::string start_timeout_line_;  // the ranks' states when the bound ran out
  std::optional<int> mpirun_status_;
  Clock::time_point mpirun_exited_at_{};
};

// "start-up took longer than 300 s: rank 1 on nodeB did not reach training; ranks 2-3 never
// started ..." from each rank's state: nullopt host = never started, reached ranks skipped.
struct StartState {
  std::optional<std::string> host;  // nullopt: the rank's supervisor never said hello
  bool reached = false;
};
std::string describe_start_timeout(double timeout_s, const std::vector<StartState>& ranks);

}  // namespace dtrain::launcher
