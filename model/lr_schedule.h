// Learning-rate schedules: per epoch as PyTorch's StepLR and CosineAnnealingLR (closed form), and
// per optimizer step as language models are trained (llm.c, nanoGPT): linear warm-up, then cosine.
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

// Per optimizer step (from 0) of a run of total_steps: lr * (step + 1) / warmup_steps while step <
// warmup_steps, then constant (`cosine` false) or a cosine from lr down to min_lr, which it reaches at
// the last step (total_steps - 1) and keeps after it: torch_gpt_peer.py's lr_at, computed in double.
struct StepLrSchedule {
  float base_lr = 1e-3f;
  float min_lr = 1e-4f;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  bool cosine = true;

  double lr_at(int64_t step) const;
};

// A float hyper-parameter as the decimal it was written as (1e-3f as 0.001, not 0.0010000000475),
// as PyTorch and the peer hold it: the schedules and AdamW compute from it in double.
double decimal_as_written(float value);

const char* lr_schedule_name(LrSchedule::Kind kind);                               // "none", "step", "cosine"
std::optional<LrSchedule::Kind> parse_lr_schedule_kind(const std::string& name);  // the names above

}  // namespace dtrain
