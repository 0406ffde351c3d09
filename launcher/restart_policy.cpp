// The restart rules (see restart_policy.h).
#include "launcher/restart_policy.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/exit_status.h"

namespace dtrain::launcher {

namespace {

constexpr std::chrono::milliseconds kFirstBackoff{1000};
constexpr std::chrono::milliseconds kMaxBackoff{30000};

// Why retrying cannot help, or "" when it might.
std::string hopeless(const JobOutcome& o) {
  if (o.kind == JobOutcome::Kind::kInterrupted) return "interrupted";
  if (o.kind == JobOutcome::Kind::kMpirunFailed && o.exit_status == 127) return "mpirun could not be run";
  if (o.kind != JobOutcome::Kind::kRankFailed) return "";
  // dtrain's permanent failures (Note [Exit statuses] in core/exit_status.h): a bad flag, bad
  // data, a damaged or mismatched checkpoint, a model that does not fit, an unwritable output, a
  // diverged run would fail the same way on every restart.
  if (const std::string name = permanent_failure_name(o.exit_status); !name.empty())
    return fmt::format("exit status {} is {}; a restart would fail the same way", o.exit_status, name);
  if (o.exit_status == 126 || o.exit_status == 127) return "the program could not be run";
  return "";
}

}  // namespace

bool has_checkpoint_dir(const std::vector<std::string>& program) {
  return std::any_of(program.begin() + std::min<size_t>(1, program.size()), program.end(), [](const std::string& a) {
    return a == "--checkpoint-dir" || a.starts_with("--checkpoint-dir=");
  });
}

std::vector<std::string> with_resume_auto(const std::vector<std::string>& program) {
  std::vector<std::string> out;
  for (size_t i = 0; i < program.size(); ++i) {
    if (i > 0 && program[i] == "--resume") {
      ++i;  // and its value
      continue;
    }
    if (i > 0 && program[i].starts_with("--resume=")) continue;
    out.push_back(program[i]);
  }
  out.insert(out.end(), {"--resume", "auto"});
  return out;
}

RestartDecision decide_restart(const JobOutcome& outcome, int restarts_done, int max_restarts) {
  RestartDecision d;
  const std::string why_not = hopeless(outcome);
  if (max_restarts == 0 || outcome.kind == JobOutcome::Kind::kInterrupted) {
    d.line = outcome.cause;
  } else if (!why_not.empty()) {
    d.line = fmt::format("{} (not restarted: {})", outcome.cause, why_not);
  } else if (restarts_done >= max_restarts) {
    d.line = fmt::format("{} (gave up after {} restart{})", outcome.cause, max_restarts, max_restarts > 1 ? "s" : "");
  } else {
    d.restart = true;
    d.backoff = std::min<std::chrono::milliseconds>(kMaxBackoff, kFirstBackoff * (1 << std::min(restarts_done, 5)));
    d.line = fmt::format("restart {} of {} in {:g} s with --resume auto, after: {}", restarts_done + 1, max_restarts,
                         std::chrono::duration<double>(d.backoff).count(), outcome.cause);
  }
  return d;
}

}  // namespace dtrain::launcher
