#include "app/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "comm/local_topology.h"
#include "comm/mpi_lifecycle.h"

namespace dtrain {

namespace {

constexpr auto kRefresh = std::chrono::milliseconds(100);

std::string clock_text(double seconds) {
  const auto s = static_cast<int64_t>(std::max(0.0, std::round(seconds)));
  return s >= 3600 ? fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60) : fmt::format("{}:{:02}", s / 60, s % 60);
}

int terminal_width(std::FILE* out) {
  winsize ws{};
  if (ioctl(fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 100;
}

// head [####....] tail, the bar between 5 and 30 columns; without it where the width is short.
std::string with_bar(const std::string& head, double fraction, const std::string& tail, int width) {
  const int bar = std::min(30, width - static_cast<int>(head.size() + tail.size()) - 2);
  if (bar < 5) return (head + tail).substr(0, static_cast<size_t>(std::max(0, width)));
  const int filled = static_cast<int>(fraction * bar);
  return head + "[" + std::string(static_cast<size_t>(filled), '#') + std::string(static_cast<size_t>(bar - filled), '.') +
         "]" + tail;
}

}  // namespace

bool progress_wanted(ProgressMode mode, bool launched, const std::optional<std::string>& launcher_tty,
                     bool stdout_is_tty) {
  if (mode != ProgressMode::kAuto) return mode == ProgressMode::kOn;
  if (launched) return launcher_tty && *launcher_tty == "1";
  return stdout_is_tty;
}

bool progress_wanted_here(ProgressMode mode) {
  return progress_wanted(mode, started_by_launcher(process_env), process_env("DTRAIN_STDOUT_IS_TTY"),
                         isatty(STDOUT_FILENO) == 1);
}

std::string render_progress(const ProgressState& s, int width) {
  const double fraction = s.samples_in_epoch > 0 ? std::min(1.0, static_cast<double>(s.samples) / s.samples_in_epoch) : 0;
  const std::string head = fmt::format("epoch {}/{} {:3.0f}% ", s.epoch, s.epochs, 100 * fraction);
  const std::string tail = fmt::format(" {}/{}  {:.0f} samples/s  loss {:.4f}  ETA {}", s.samples, s.samples_in_epoch,
                                       s.samples_per_second, s.loss, clock_text(s.eta_seconds));
  return with_bar(head, fraction, tail, width);
}

std::string render_progress(const LmProgressState& s, int width) {
  const double fraction = s.steps > 0 ? std::min(1.0, static_cast<double>(s.step) / static_cast<double>(s.steps)) : 0;
  const std::string head = fmt::format("step {}/{} {:3.0f}% ", s.step, s.steps, 100 * fraction);
  const std::string tail = fmt::format("  {:.0f} tokens/s  loss {:.4f}  lr {:.2e}  ETA {}", s.tokens_per_second, s.loss,
                                       s.lr, clock_text(s.eta_seconds));
  return with_bar(head, fraction, tail, width);
}

ProgressLine::ProgressLine(std::FILE* out) : out_(out) {}

bool ProgressLine::due(bool force) const {
  return force || !drawn_ || std::chrono::steady_clock::now() - last_draw_ >= kRefresh;
}

int ProgressLine::width() const { return terminal_width(out_) - 1; }

void ProgressLine::redraw(const std::string& line) {
  // Carriage return, the line, clear to the end of the line: redrawn in place.
  fmt::print(out_, "\r{}\x1b[K", line);
  std::fflush(out_);
  last_draw_ = std::chrono::steady_clock::now();
  drawn_ = true;
}

void ProgressLine::finish() {
  if (!drawn_) return;
  fmt::print(out_, "\n");
  std::fflush(out_);
  drawn_ = false;
}

}  // namespace dtrain
