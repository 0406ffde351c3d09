// Restarts (dtrain-launch --max-restarts K): whether a failed job is started again, after how
// long, with which arguments (the program's own, with `--resume auto` so that it continues from
// its newest checkpoint), and the one line printed for each restart or for giving up. Pure.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "launcher/job_monitor.h"

namespace dtrain::launcher {

// Whether the program's arguments include --checkpoint-dir (as `--checkpoint-dir DIR` or
// `--checkpoint-dir=DIR`): restarts need checkpoints to resume from.
bool has_checkpoint_dir(const std::vector<std::string>& program);

// The program's arguments with any --resume (`--resume X`, `--resume=X`) replaced by a final
// `--resume auto`: a restart continues from the newest checkpoint, whatever the first run
// resumed from.
std::vector<std::string> with_resume_auto(const std::vector<std::string>& program);

struct RestartDecision {
  bool restart = false;
  std::chrono::milliseconds backoff{0};
  std::string line;  // what dtrain-launch prints, without "dtrain-launch: "
};

// After an attempt ended with `outcome` (not a success), `restarts_done` of `max_restarts`
// restarts having been used: restart (after 1 s, 2 s, 4 s ... at most 30 s) unless none is
// left, the user interrupted, or the failure cannot go away by retrying (dtrain's permanent exit
// statuses, core/exit_status.h: 2 a usage error, 3 a diverged run, 65 bad data, 66 a checkpoint,
// 71 out of memory, 73 an unwritable output; 126 or 127, a program that cannot be run; mpirun
// itself missing).
RestartDecision decide_restart(const JobOutcome& outcome, int restarts_done, int max_restarts);

}  // namespace dtrain::launcher
