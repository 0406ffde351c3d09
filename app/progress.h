// The progress line rank 0 redraws in place on a terminal; an image model's (epochs of samples):
//   epoch 1/3  45% [##########.............]  27008/60000  91,200 samples/s  loss 0.5123  ETA 0:03
// a language model's (optimizer steps):
//   step 120/500  24% [#######...............]  4114 tokens/s  loss 2.3456  lr 9.87e-04  ETA 1:32
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
// progress_wanted for this process: its environment and its stdout.
bool progress_wanted_here(ProgressMode mode);

struct ProgressState {
  int64_t epoch = 0, epochs = 1;      // epoch counts from 1
  int64_t samples = 0, samples_in_epoch = 0;
  double samples_per_second = 0;
  float loss = 0;
  double eta_seconds = 0;  // the whole run
};

// A language model's run: optimizer steps, not epochs.
struct LmProgressState {
  int64_t step = 0, steps = 1;  // steps done (this one included) of --steps
  double tokens_per_second = 0;
  float loss = 0;
  double lr = 0;
  double eta_seconds = 0;  // the steps left
};

// The line for `state`, at most `width` columns (the bar shrinks first). Pure.
std::string render_progress(const ProgressState& state, int width);
std::string render_progress(const LmProgressState& state, int width);

class ProgressLine {
 public:
  explicit ProgressLine(std::FILE* out = stdout);
  // Redraws when the last draw is older than the refresh interval (or `force`).
  bool due(bool force = false) const;
  void draw(const ProgressState& state) { redraw(render_progress(state, width())); }
  void draw(const LmProgressState& state) { redraw(render_progress(state, width())); }
  // Ends the line (a newline after the last draw), so the next output starts below it.
  void finish();

 private:
  int width() const;  // the terminal's columns, less one (no wrap at the last column)
  void redraw(const std::string& line);

  std::FILE* out_;
  std::chrono::steady_clock::time_point last_draw_{};
  bool drawn_ = false;
};

}  // namespace dtrain
