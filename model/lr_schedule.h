// Learning-rate schedules, per epoch as PyTorch's StepLR and CosineAnnealingLR (closed form).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace dtrain {

struct LrSchedule {
  enum class Kind { kConstant, kStep, kCosine } kind = Kind::kConstant;
  float base_lr = 0.01f;
  int64_t step_size = 1;  // kStep: multiply by gamma every step_size epochs
  float gamma = 0.1f;
  int64_t total_epochs = 1;  // kCosine: T_max
  float min_lr = 0.f;        // kCosine: eta_min

  float lr_at(int64_t epoch) const;  // epoch counts from 0
};

const char* lr_schedule_name(LrSchedule::Kind kind);                               // "none", "step", "cosine"
std::optional<LrSchedule::Kind> parse_lr_schedule_kind(const std::string& name);  // the names above

}  // namespace dtrain
