// The exit statuses of dtrain's programs (dtrain train, eval, bench, flight-report), one per kind
// of failure (core/error.h), and which of them a restart cannot fix: the command line maps an
// error to its status here, and dtrain-launch --max-restarts reads a rank's status back here.
//
// Note [Exit statuses]
//   A scheduler or dtrain-launch --max-restarts sees only a number, and must tell a failure a
//   restart may fix (a peer that died or stopped, a collective that timed out, a lost node: 1)
//   from one that would only fail again, minutes of start-up and data loading later. So:
//   - 1 stays the status of every failure not known to be permanent: a restart may fix it, and
//     a failure nobody classified is retried, as before the kinds existed;
//   - 2 (a flag, as getopt programs use) and 3 (a diverged run, app/divergence.h) keep theirs;
//   - the permanent kinds take sysexits.h's numbers where one fits, since that is the only
//     convention scripts and mail systems already read: 65 EX_DATAERR for bad data, 66
//     EX_NOINPUT for a checkpoint or weights file that cannot be used (damaged, or made for
//     another model or run), 71 EX_OSERR for a model or data set that does not fit in memory
//     (the system cannot give what the run needs), 73 EX_CANTCREAT for an output path that
//     cannot be written. EX_USAGE (64) is not used: 2 was the contract first;
//   - none is 124 (dtrain-launch's start-up bound, timeout(1)'s), 126 or 127 (a shell that cannot
//     run the program), 128 + N (a process ended by signal N; dtrain train stopped by SIGINT or
//     SIGTERM after its checkpoint exits so too), or 77 (CTest's skip status in tests);
//   - ranks that agree on an error (train/root_broadcast.h) agree on its kind, so every rank exits
//     with one status; ranks that fail on their own each abort with theirs, and mpirun reports
//     the first.
#pragma once

#include <string>

#include "core/error.h"

namespace dtrain {

inline constexpr int kExitFailure = 1;      // may go away on a restart
inline constexpr int kExitUsage = 2;        // a flag or setting
inline constexpr int kExitDiverged = 3;     // a NaN or an infinity (app/divergence.h)
inline constexpr int kExitBadData = 65;     // EX_DATAERR
inline constexpr int kExitCheckpoint = 66;  // EX_NOINPUT
inline constexpr int kExitNoMemory = 71;    // EX_OSERR
inline constexpr int kExitOutput = 73;      // EX_CANTCREAT

// The status a program exits with for an error of `kind`.
constexpr int exit_status(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kFailure: return kExitFailure;
    case ErrorKind::kUsage: return kExitUsage;
    case ErrorKind::kData: return kExitBadData;
    case ErrorKind::kCheckpoint: return kExitCheckpoint;
    case ErrorKind::kResources: return kExitNoMemory;
    case ErrorKind::kOutput: return kExitOutput;
    case ErrorKind::kDiverged: return kExitDiverged;
  }
  return kExitFailure;
}

// What a dtrain status that no restart can fix means ("a corrupt or mismatched checkpoint"), or
// "" for any other status (0, 1, a signal's, another program's).
inline std::string permanent_failure_name(int status) {
  switch (status) {
    case kExitUsage: return "a usage error";
    case kExitDiverged: return "a diverged training run (a NaN or an infinity)";
    case kExitBadData: return "bad data";
    case kExitCheckpoint: return "a corrupt or mismatched checkpoint or weights file";
    case kExitNoMemory: return "a model or data set that does not fit in memory";
    case kExitOutput: return "an output path that cannot be written";
    default: return "";
  }
}

}  // namespace dtrain
