#include "model/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "core/error.h"

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

const char* lr_schedule_name(LrSchedule::Kind kind) {
  switch (kind) {
    case LrSchedule::Kind::kConstant: return "none";
    case LrSchedule::Kind::kStep: return "step";
    case LrSchedule::Kind::kCosine: return "cosine";
  }
  return "?";
}

std::optional<LrSchedule::Kind> parse_lr_schedule_kind(const std::string& name) {
  for (auto kind : {LrSchedule::Kind::kConstant, LrSchedule::Kind::kStep, LrSchedule::Kind::kCosine})
    if (name == lr_schedule_name(kind)) return kind;
  return std::nullopt;
}

}  // namespace dtrain
