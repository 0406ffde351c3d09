#include "model/lr_schedule.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numbers>

#include "core/error.h"
#include "core/named_enum.h"

namespace dtrain {

float LrSchedule::lr_at(int64_t epoch) const {
  switch (kind) {
    case Kind::kConstant: return base_lr;
    case Kind::kStep: return base_lr * std::pow(gamma, static_cast<float>(epoch / std::max<int64_t>(step_size, 1)));
    case Kind::kCosine: {
      double t = static_cast<double>(std::min(epoch, total_epochs)) / static_cast<double>(std::max<int64_t>(total_epochs, 1));
      return static_cast<float>(min_lr + (base_lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * t)));
    }
  }
  return base_lr;
}

// 0.999f is 0.99899999797 as a double, PyTorch holds 0.999: the shortest decimal that reads back
// to the float, as a double.
double decimal_as_written(float value) {
  char text[32];
  const auto end = std::to_chars(text, text + sizeof text, value).ptr;
  double out = value;
  std::from_chars(text, end, out);
  return out;
}

double StepLrSchedule::lr_at(int64_t step) const {
  const double lr = decimal_as_written(base_lr), lowest = decimal_as_written(min_lr);
  if (step < warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (!cosine) return lr;
  // The decay spans steps warmup_steps .. total_steps - 1 (at least one step, as the peer's max(1, ...)).
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - 1 - warmup_steps));
  const double frac = std::min(1.0, static_cast<double>(step - warmup_steps) / span);
  return lowest + 0.5 * (lr - lowest) * (1.0 + std::cos(std::numbers::pi * frac));
}

namespace {
using Kind = LrSchedule::Kind;
constexpr auto kSchedules =
    enum_names<Kind>(std::pair{Kind::kConstant, "none"}, std::pair{Kind::kStep, "step"}, std::pair{Kind::kCosine, "cosine"});
}  // namespace

const char* lr_schedule_name(LrSchedule::Kind kind) { return kSchedules.name(kind); }
std::optional<LrSchedule::Kind> parse_lr_schedule_kind(const std::string& name) { return kSchedules.parse(name); }

}  // namespace dtrain
