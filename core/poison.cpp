// The poisoned-process mark (see poison.h).
#include "core/poison.h"

#include <atomic>
#include <mutex>

namespace dtrain {

namespace {

// The flag is read on every save; the mutex orders the reason before the flag for a reader
// that sees the flag.
std::atomic<bool> g_poisoned{false};
std::mutex g_mutex;
std::string g_reason;

}  // namespace

void poison_process(std::string_view reason) noexcept {
  std::lock_guard lock(g_mutex);
  if (g_poisoned.load(std::memory_order_relaxed)) return;
  try {
    g_reason.assign(reason.empty() ? std::string_view("unknown") : reason);
  } catch (...) {
    g_reason.clear();  // "unknown" below: the mark matters more than its text
  }
  g_poisoned.store(true, std::memory_order_seq_cst);
}

std::string process_poison() {
  if (!g_poisoned.load(std::memory_order_seq_cst)) return "";
  std::lock_guard lock(g_mutex);
  return g_reason.empty() ? "unknown" : g_reason;
}

bool publish_unless_poisoned(const std::function<void()>& publish) {
  std::lock_guard lock(g_mutex);
  if (g_poisoned.load(std::memory_order_seq_cst)) return false;
  publish();
  return true;
}

void clear_process_poison_for_tests() {
  std::lock_guard lock(g_mutex);
  g_reason.clear();
  g_poisoned.store(false, std::memory_order_seq_cst);
}

}  // namespace dtrain
