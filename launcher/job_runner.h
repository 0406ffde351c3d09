// Runs one attempt of a dtrain-launch job: starts mpirun (its own process group, so a Ctrl-C
// reaches dtrain-launch alone and dtrain-launch decides how the job ends), accepts the rank
// supervisors' connections, feeds what they and the signals say to a JobMonitor, and carries out
// its decisions (an interrupt passed to every rank through its supervisor, SIGTERM, SIGKILL to
// mpirun) until the job has ended. The effects around the pure JobMonitor.
#pragma once

#include <string>
#include <vector>

#include "launcher/job_monitor.h"
#include "launcher/posix_io.h"

namespace dtrain::launcher {

struct JobAttempt {
  std::vector<std::string> mpirun_argv;
  int np = 0;
  std::string token;  // what this attempt's rank supervisors say in their hello
  MonitorTimings timings;
};

// `listener`: where the rank supervisors connect; `signals`: dtrain-launch's SignalPipe (SIGINT,
// SIGTERM, SIGHUP, SIGQUIT end the job; SIGUSR1 and SIGUSR2 are passed to mpirun, which passes them to
// the ranks; SIGCHLD). Returns when mpirun has ended and the supervisors are gone (or given up
// on); mpirun that cannot be started is a kMpirunFailed outcome with status 127.
JobOutcome run_job_attempt(const JobAttempt& attempt, Listener& listener, SignalPipe& signals);

}  // namespace dtrain::launcher
