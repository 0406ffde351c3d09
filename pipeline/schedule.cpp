// Pipeline schedules and their deadlock check (Note [Pipeline schedules]).
#include "pipeline/schedule.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"
#include "core/named_enum.h"

namespace dtrain {

namespace {

constexpr auto kSchedules = enum_names<PipelineSchedule>(std::pair{PipelineSchedule::kGpipe, "gpipe"},
                                                         std::pair{PipelineSchedule::k1f1b, "1f1b"});

}  // namespace

const char* pipeline_schedule_name(PipelineSchedule s) { return kSchedules.name(s); }
std::optional<PipelineSchedule> parse_pipeline_schedule(const std::string& name) { return kSchedules.parse(name); }

std::string micro_batch_problem(int stages, int micro_batches) {
  if (micro_batches < stages)
    return fmt::format("{} micro-batches are fewer than the {} pipeline stages: every stage needs a micro-batch in "
                       "flight (use at least {})",
                       micro_batches, stages, stages);
  if (micro_batches > 8191) return fmt::format("{} micro-batches: at most 8191 (the message tags)", micro_batches);
  return "";
}

std::vector<PipeAction> stage_actions(PipelineSchedule schedule, int stages, int micro_batches, int stage) {
  if (std::string problem = micro_batch_problem(stages, micro_batches); !problem.empty()) throw Error(problem);
  DTRAIN_CHECK(stage >= 0 && stage < stages, "stage {} of {}", stage, stages);
  std::vector<PipeAction> out;
  const int M = micro_batches;
  if (schedule == PipelineSchedule::kGpipe) {
    for (int m = 0; m < M; ++m) out.push_back({PipeAction::kForward, m});
    for (int m = 0; m < M; ++m) out.push_back({PipeAction::kBackward, m});
    return out;
  }
  const int warmup = std::min(stages - 1 - stage, M);
  for (int m = 0; m < warmup; ++m) out.push_back({PipeAction::kForward, m});
  for (int i = 0; i < M - warmup; ++i) {
    out.push_back({PipeAction::kForward, warmup + i});
    out.push_back({PipeAction::kBackward, i});
  }
  for (int m = M - warmup; m < M; ++m) out.push_back({PipeAction::kBackward, m});
  return out;
}

std::vector<PipeStep> stage_program(PipelineSchedule schedule, int stages, int micro_batches, int stage) {
  const bool first = stage == 0, last = stage == stages - 1;
  std::vector<PipeStep> out;
  std::vector<PipeTransfer> pending;  // the previous action's sends
  for (const PipeAction& a : stage_actions(schedule, stages, micro_batches, stage)) {
    PipeStep step;
    step.transfers = std::move(pending);
    pending.clear();
    step.action = a;
    if (a.kind == PipeAction::kForward) {
      if (!first) step.transfers.push_back({PipeTransfer::kRecvActivation, a.micro_batch, stage - 1});
      if (!last) pending.push_back({PipeTransfer::kSendActivation, a.micro_batch, stage + 1});
    } else {
      if (!last) step.transfers.push_back({PipeTransfer::kRecvGrad, a.micro_batch, stage + 1});
      if (!first) pending.push_back({PipeTransfer::kSendGrad, a.micro_batch, stage - 1});
    }
    out.push_back(std::move(step));
  }
  PipeStep flush;
  flush.transfers = std::move(pending);
  flush.has_action = false;
  out.push_back(std::move(flush));
  return out;
}

int peak_held_inputs(const std::vector<PipeAction>& actions) {
  int held = 0, peak = 0;
  for (const PipeAction& a : actions) {
    held += a.kind == PipeAction::kForward ? 1 : -1;
    peak = std::max(peak, held);
  }
  return peak;
}

std::string find_deadlock(const std::vector<std::vector<PipeStep>>& programs) {
  const size_t P = programs.size();
  std::vector<size_t> at(P, 0);  // the batch each stage has posted and waits in
  // A transfer of stage s is matched when its partner, on the peer, is in a batch the peer has
  // posted (at or before where the peer is): posted transfers stay posted until they complete.
  auto posted_by_peer = [&](size_t s, const PipeTransfer& t) {
    const auto peer = static_cast<size_t>(t.peer_stage);
    if (peer >= P) return false;
    for (size_t k = 0; k <= at[peer] && k < programs[peer].size(); ++k)
      for (const PipeTransfer& u : programs[peer][k].transfers)
        if (static_cast<size_t>(u.peer_stage) == s && u.tag() == t.tag() && u.is_send() != t.is_send()) return true;
    return false;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t s = 0; s < P; ++s) {
      while (at[s] < programs[s].size()) {
        bool ready = true;
        for (const PipeTransfer& t : programs[s][at[s]].transfers) ready = ready && posted_by_peer(s, t);
        if (!ready) break;
        ++at[s];
        progress = true;
      }
    }
  }
  std::string out;
  for (size_t s = 0; s < P; ++s)
    if (at[s] < programs[s].size())
      out += fmt::format("{}stage {} waits in batch {} of {}", out.empty() ? "" : "; ", s, at[s], programs[s].size());
  return out;
}

}  // namespace dtrain
