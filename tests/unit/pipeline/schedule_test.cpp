// Pipeline schedules and partitions (Note [Pipeline schedules], Note [Pipeline partition]),
// without MPI: every (P, M) the tests try finishes under MPI's matching rules (no two stages
// wait on each other), each micro-batch is forwarded then backwarded exactly once per stage in
// an order the data allows, GPipe holds M inputs and 1F1B at most P - s, and the partition is
// balanced or where the user cut.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "core/error.h"
#include "tests/unit/data/error_of.h"
#include "pipeline/partition.h"
#include "pipeline/schedule.h"

namespace dtrain {
namespace {

std::vector<std::vector<PipeStep>> programs(PipelineSchedule s, int P, int M) {
  std::vector<std::vector<PipeStep>> out;
  for (int stage = 0; stage < P; ++stage) out.push_back(stage_program(s, P, M, stage));
  return out;
}

TEST(PipelineSchedule, EveryScheduleFinishesWithoutDeadlockForStagesUpTo8AndMicroBatchesUpTo16) {
  for (PipelineSchedule s : {PipelineSchedule::kGpipe, PipelineSchedule::k1f1b})
    for (int P = 1; P <= 8; ++P)
      for (int M = P; M <= 16; ++M)
        EXPECT_EQ(find_deadlock(programs(s, P, M)), "") << pipeline_schedule_name(s) << " P " << P << " M " << M;
}

TEST(PipelineSchedule, BlockingSendsInTheSameOrderWouldDeadlockAndTheCheckSaysSo) {
  // The check is not vacuous: 1F1B's stage 0 and 1 with each send alone in a batch before the
  // receive (blocking MPI_Send first, pytorch#172668) never finish.
  auto p = programs(PipelineSchedule::k1f1b, 2, 4);
  for (auto& prog : p) {
    std::vector<PipeStep> split;
    for (PipeStep& step : prog) {
      PipeStep sends, rest = step;
      sends.has_action = false;
      rest.transfers.clear();
      for (const PipeTransfer& t : step.transfers) (t.is_send() ? sends.transfers : rest.transfers).push_back(t);
      if (!sends.transfers.empty()) split.push_back(sends);
      split.push_back(rest);
    }
    prog = split;
  }
  EXPECT_NE(find_deadlock(p), "");
}

TEST(PipelineSchedule, EachMicroBatchRunsForwardThenBackwardOnceAndBackwardsRunInOrder) {
  for (PipelineSchedule s : {PipelineSchedule::kGpipe, PipelineSchedule::k1f1b})
    for (int P = 1; P <= 5; ++P)
      for (int M = P; M <= 9; ++M)
        for (int stage = 0; stage < P; ++stage) {
          std::map<int, int> forwarded;
          std::vector<int> backward_order;
          for (const PipeAction& a : stage_actions(s, P, M, stage)) {
            if (a.kind == PipeAction::kForward) {
              EXPECT_EQ(forwarded[a.micro_batch]++, 0);
            } else {
              EXPECT_EQ(forwarded[a.micro_batch], 1) << "backward before forward";
              backward_order.push_back(a.micro_batch);
            }
          }
          std::vector<int> in_order(static_cast<size_t>(M));
          for (int m = 0; m < M; ++m) in_order[static_cast<size_t>(m)] = m;
          EXPECT_EQ(backward_order, in_order) << "the gradients must add up in one fixed order";
        }
}

TEST(PipelineSchedule, GpipeHoldsEveryMicroBatchAnd1f1bAtMostTheStagesAfterIt) {
  for (int P = 1; P <= 6; ++P)
    for (int M = P; M <= 12; ++M)
      for (int stage = 0; stage < P; ++stage) {
        EXPECT_EQ(peak_held_inputs(stage_actions(PipelineSchedule::kGpipe, P, M, stage)), M);
        EXPECT_EQ(peak_held_inputs(stage_actions(PipelineSchedule::k1f1b, P, M, stage)), P - stage);
      }
}

// Note [Pipeline on a GPU] (pipeline/grid.h): NCCL has no tags, it matches a pair's sends and
// receives by issue order. So for every ordered pair of stages, the tags of the sends one issues
// to the other (across the step's batches, in program order) must be the tags of the receives
// the other issues from it, in the same order; MPI's tag matching would forgive a swap.
TEST(PipelineSchedule, EveryPairsSendsAndReceivesAreIssuedInTheSameOrderAsNcclMatchesThem) {
  for (PipelineSchedule schedule : {PipelineSchedule::k1f1b, PipelineSchedule::kGpipe})
    for (int stages = 1; stages <= 8; ++stages)
      for (int micro = stages; micro <= 16; ++micro) {
        // (from, to) -> tags in issue order, as sent and as received.
        std::map<std::pair<int, int>, std::vector<int>> sent, received;
        for (int stage = 0; stage < stages; ++stage)
          for (const PipeStep& step : stage_program(schedule, stages, micro, stage))
            for (const PipeTransfer& t : step.transfers) {
              if (t.is_send()) sent[{stage, t.peer_stage}].push_back(t.tag());
              else received[{t.peer_stage, stage}].push_back(t.tag());
            }
        EXPECT_EQ(sent, received) << "P " << stages << ", M " << micro << ", "
                                  << (schedule == PipelineSchedule::k1f1b ? "1f1b" : "gpipe");
        EXPECT_EQ(sent.size(), stages == 1 ? 0u : 2u * static_cast<size_t>(stages - 1));
      }
}

TEST(PipelineSchedule, FewerMicroBatchesThanStagesIsOneLine) {
  EXPECT_EQ(micro_batch_problem(4, 2),
            "2 micro-batches are fewer than the 4 pipeline stages: every stage needs a micro-batch in flight (use at "
            "least 4)");
  EXPECT_THROW(stage_actions(PipelineSchedule::k1f1b, 4, 2, 0), Error);
  EXPECT_EQ(micro_batch_problem(2, 2), "");
  EXPECT_EQ(parse_pipeline_schedule("1f1b"), PipelineSchedule::k1f1b);
  EXPECT_EQ(parse_pipeline_schedule("gpipe"), PipelineSchedule::kGpipe);
  EXPECT_EQ(parse_pipeline_schedule("zb"), std::nullopt);
}

TEST(PipelinePartition, BalancedByParameterCountWithTheEarliestCutOnATie) {
  // An MLP: Flatten, Linear 100, ReLU, Linear 50, ReLU, Linear 50, ReLU, Linear 10.
  const std::vector<int64_t> params = {0, 100, 0, 50, 0, 50, 0, 10};
  EXPECT_EQ(balanced_partition(params, 1), (std::vector<StageRange>{{0, 8}}));
  const auto two = balanced_partition(params, 2);
  EXPECT_EQ(two, (std::vector<StageRange>{{0, 2}, {2, 8}}));  // 100 | 110 beats 150 | 60
  EXPECT_EQ(describe_partition(two), "0-1 | 2-7");
  const auto three = balanced_partition(params, 3);
  int64_t largest = 0;
  for (const StageRange& r : three) {
    int64_t sum = 0;
    for (size_t i = r.begin; i < r.end; ++i) sum += params[i];
    largest = std::max(largest, sum);
    EXPECT_LT(r.begin, r.end);
  }
  EXPECT_EQ(largest, 100);
  EXPECT_THROW(balanced_partition({1, 2}, 3), Error);
}

TEST(PipelinePartition, AUserSplitIsCheckedAndKept) {
  EXPECT_EQ(partition_at({3, 5}, 8, 3), (std::vector<StageRange>{{0, 3}, {3, 5}, {5, 8}}));
  auto error_of = [](auto f) { return testing::error_of(f).first; };
  EXPECT_EQ(error_of([] { partition_at({3}, 8, 3); }), "1 cut(s) for 3 pipeline stages, which need 2");
  EXPECT_NE(error_of([] { partition_at({5, 3}, 8, 3); }).find("layer 3 cannot start a stage"), std::string::npos);
  EXPECT_NE(error_of([] { partition_at({8}, 8, 2); }).find("layer 8 cannot start a stage"), std::string::npos);
}

}  // namespace
}  // namespace dtrain
