// The collective watchdog's decision, as a pure function: given the operations still in
// flight (with their start times), the time now, the timeout and any asynchronous error the
// backend reported, what to do. The NCCL watchdog thread (comm/nccl/nccl_watchdog.h) acts on
// it; keeping the decision free of NCCL lets CPU-only builds test it. Header-only so that it
// needs no build wiring in either build.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>

#include <fmt/format.h>

namespace dtrain {

using WatchdogClock = std::chrono::steady_clock;

struct WatchdogPending {
  int64_t seq = 0;      // 1, 2, ... in issue order (0 for set-up and shut-down phases)
  std::string op;       // "allreduce", "broadcast", "init", ...
  WatchdogClock::time_point start;
};

enum class WatchdogAction { kNone, kFail, kTimeout };

struct WatchdogVerdict {
  WatchdogAction action = WatchdogAction::kNone;
  int64_t seq = 0;
  std::string op;       // empty when a failure concerns no particular operation
  double waited_s = 0;  // how long the blamed operation had been in flight
  std::string error;    // kFail: the backend's error
};

// An asynchronous error wins over a timeout and is blamed on the oldest pending operation (the
// one a broken connection stalls first); otherwise the oldest operation older than `timeout`
// times out. Operations that finished must already be removed from `pending`.
inline WatchdogVerdict watchdog_decide(std::span<const WatchdogPending> pending, WatchdogClock::time_point now,
                                       WatchdogClock::duration timeout, const std::string& async_error) {
  const WatchdogPending* oldest = nullptr;
  for (const WatchdogPending& p : pending) {
    if (!oldest || p.start < oldest->start) oldest = &p;
  }
  WatchdogVerdict v;
  if (oldest) {
    v.seq = oldest->seq;
    v.op = oldest->op;
    v.waited_s = std::chrono::duration<double>(now - oldest->start).count();
  }
  if (!async_error.empty()) {
    v.action = WatchdogAction::kFail;
    v.error = async_error;
  } else if (oldest && now - oldest->start > timeout) {
    v.action = WatchdogAction::kTimeout;
  }
  return v;
}

// What failed, without the rank's prefix (an error thrown with it is prefixed once where it is
// printed), e.g. "NCCL allreduce #42 failed: unhandled system error"; "" for kNone.
inline std::string watchdog_failure_text(const WatchdogVerdict& v) {
  std::string what = v.op.empty() ? "communicator" : (v.seq > 0 ? fmt::format("{} #{}", v.op, v.seq) : v.op);
  switch (v.action) {
    case WatchdogAction::kTimeout:
      return fmt::format("NCCL {} timed out after {:.1f}s (a peer may have died or issued different collectives)",
                         what, v.waited_s);
    case WatchdogAction::kFail:
      return fmt::format("NCCL {} failed: {}", what, v.error);
    case WatchdogAction::kNone:
      break;
  }
  return {};
}

// The one line the watchdog prints before it takes the process down, e.g.
//   "dtrain: rank 3: NCCL allreduce #42 timed out after 600.0s"
//   "dtrain: rank 3: NCCL allreduce #42 failed: unhandled system error"
inline std::string watchdog_message(int rank, const WatchdogVerdict& v) {
  const std::string text = watchdog_failure_text(v);
  return text.empty() ? text : fmt::format("dtrain: rank {}: {}", rank, text);
}

}  // namespace dtrain
