// The progress line rank 0 redraws in place on a terminal:
//   epoch 1/3  45% [##########.............]  27008/60000  91,200 samples/s  loss 0.5123  ETA 0:03
// When the output is not a terminal the seeds' plain lines are printed instead.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "app/train_config.h"

namespace dtrain {

// Whether to draw the line. on/off as asked; auto: when the user's terminal shows the output.
// Under mpirun a rank's stdout is a pseudo-terminal even when the job's output goes to a file,
// so a launched rank goes by what dtrain-launch saw of its own stdout (DTRAIN_STDOUT_IS_TTY,
// "1" or "0"; absent under plain mpirun: no line), and a process started alone by its own.
bool progress_wanted(ProgressMode mode, bool launched, const std::optional<std::string>& launcher_tty,
                     bool stdout_is_tty);

struct ProgressState {
  int64_t epoch = 0, epochs = 1;      // epoch counts from 1
  int64_t samples = 0, samples_in_epoch = 0;
  double samples_per_second = 0;
  float loss = 0;
  double eta_seconds = 0;  // the whole run
};

// The line for `state`, at most `width` columns (the bar shrinks first). Pure.
std::string render_progress(const ProgressState& state, int width);

class ProgressLine {
 public:
  explicit ProgressLine(std::FILE* out = stdout);
  // Redraws when the last draw is older than the refresh interval (or `force`).
  bool due(bool force = false) const;
  void draw(const ProgressState& state);
  // Ends the line (a newline after the last draw), so the next output starts below it.
  void finish();

 private:
  std::FILE* out_;
  std::chrono::steady_clock::time_point last_draw_{};
  bool drawn_ = false;
};

}  // namespace dtrain
