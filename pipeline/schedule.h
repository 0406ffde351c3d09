// Note [Pipeline schedules]: what each stage does in one step, as a pure list (testable without
// MPI). A stage runs forward (F) and backward (B) actions on micro-batches 0..M-1:
//  - GPipe: F0 .. F(M-1), then B0 .. B(M-1): every micro-batch's stage input is held until its
//    backward (M at the peak);
//  - 1F1B: stage s runs w = min(P-1-s, M) forwards, then alternates F(w+i), B(i), then the last
//    w backwards: at most P-s inputs held at once.
// Both run the backwards in micro-batch order 0..M-1, so the gradients add up in one fixed order
// whatever the schedule: GPipe and 1F1B give the same weights bit for bit.
//
// Communication: before each action, one batch (Note [Point-to-point] in comm/communicator.h)
// with the sends the previous action produced (its activation to stage s+1 after F, its input
// gradient to stage s-1 after B) and the receive this action needs (the activation from s-1
// before F, the gradient from s+1 before B); after the last action, a batch with its sends.
// Posted together, a send and a receive cannot wait on each other; find_deadlock() checks every
// stage's batches together, for each (P, M) the tests try, the way MPI would match them.
// The bubble, for both: (P-1)/(M+P-1) of a step.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace dtrain {

enum class PipelineSchedule { kGpipe, k1f1b };
const char* pipeline_schedule_name(PipelineSchedule s);                      // "gpipe", "1f1b"
std::optional<PipelineSchedule> parse_pipeline_schedule(const std::string& name);  // the names above

struct PipeAction {
  enum Kind { kForward, kBackward } kind = kForward;
  int micro_batch = 0;
  bool operator==(const PipeAction&) const = default;
};

struct PipeTransfer {
  enum Kind { kSendActivation, kRecvActivation, kSendGrad, kRecvGrad } kind = kSendActivation;
  int micro_batch = 0;
  int peer_stage = 0;
  // The message's tag: activations 2 m, gradients 2 m + 1 (a peer sends both kinds).
  int tag() const { return 2 * micro_batch + (kind == kSendGrad || kind == kRecvGrad ? 1 : 0); }
  bool is_send() const { return kind == kSendActivation || kind == kSendGrad; }
};

// One batch of transfers, then (unless it is the final flush) one action.
struct PipeStep {
  std::vector<PipeTransfer> transfers;
  bool has_action = true;
  PipeAction action;
};

// Stage `stage`'s actions in one step (P stages, M micro-batches; M >= P >= 1).
std::vector<PipeAction> stage_actions(PipelineSchedule schedule, int stages, int micro_batches, int stage);
// The same with the transfers before each action and the final flush.
std::vector<PipeStep> stage_program(PipelineSchedule schedule, int stages, int micro_batches, int stage);

// The most micro-batches whose stage input is held at once (forwarded, not yet backwarded).
int peak_held_inputs(const std::vector<PipeAction>& actions);

// Runs every stage's program as MPI would: a batch completes once each of its transfers'
// partners is posted (in a batch the peer has reached). "" when every stage finishes; otherwise
// one line naming where each stage is stuck. `programs[s]` is stage s's.
std::string find_deadlock(const std::vector<std::vector<PipeStep>>& programs);

// "2 micro-batches are fewer than the 4 pipeline stages: ..." or "" when (P, M) can run.
std::string micro_batch_problem(int stages, int micro_batches);

}  // namespace dtrain
