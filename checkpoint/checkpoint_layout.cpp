#include "checkpoint/checkpoint_layout.h"

#include <algorithm>
#include <charconv>

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain::checkpoint {
namespace {

// A non-negative decimal with no sign, no padding and no trailing characters.
template <class T>
std::optional<T> parse_plain_number(std::string_view digits) {
  if (digits.empty() || (digits.size() > 1 && digits[0] == '0')) return std::nullopt;
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  T value{};
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return value;
}

}  // namespace

std::string step_dir_name(int64_t step) { return fmt::format("step-{}", step); }

std::optional<int64_t> parse_step_dir_name(std::string_view name) {
  if (!name.starts_with("step-")) return std::nullopt;
  return parse_plain_number<int64_t>(name.substr(5));
}

std::optional<int64_t> parse_latest(std::string_view content) {
  if (!content.ends_with('\n')) return std::nullopt;
  content.remove_suffix(1);
  return parse_step_dir_name(content);
}

std::string latest_content(int64_t step) { return step_dir_name(step) + "\n"; }

std::vector<int64_t> steps_to_delete(std::vector<int64_t> existing, int64_t newest, int keep) {
  DTRAIN_CHECK(keep >= 1, "keep {} checkpoints", keep);
  std::sort(existing.begin(), existing.end(), std::greater<>());
  existing.erase(std::unique(existing.begin(), existing.end()), existing.end());
  std::vector<int64_t> doomed;
  int kept = 1;  // newest always stays
  for (int64_t step : existing) {
    if (step >= newest) continue;  // newer than the checkpoint just completed: not ours to judge
    if (kept < keep) {
      ++kept;
      continue;
    }
    doomed.push_back(step);
  }
  return doomed;
}

std::optional<uint64_t> parse_fault_after_bytes(const char* value) {
  if (!value || !*value) return std::nullopt;
  auto n = std::string_view(value) == "0" ? std::optional<uint64_t>(0) : parse_plain_number<uint64_t>(value);
  if (!n) throw Error(fmt::format("{}={}: expected a whole number of bytes", kFaultEnv, value));
  return n;
}

}  // namespace dtrain::checkpoint
