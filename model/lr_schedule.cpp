#include "model/lr_schedule.h"

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

namespace {
using Kind = LrSchedule::Kind;
constexpr auto kSchedules =
    enum_names<Kind>(std::pair{Kind::kConstant, "none"}, std::pair{Kind::kStep, "step"}, std::pair{Kind::kCosine, "cosine"});
}  // namespace

const char* lr_schedule_name(LrSchedule::Kind kind) { return kSchedules.name(kind); }
std::optional<LrSchedule::Kind> parse_lr_schedule_kind(const std::string& name) { return kSchedules.parse(name); }

}  // namespace dtrain
