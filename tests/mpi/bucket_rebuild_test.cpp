// Buckets like PyTorch after the first step, at np 2 and 3: the rebuild in the order rank 0's
// gradients became ready (Note [Rebuilding buckets] in ddp/reducer.h) and --bucket-cap-mb auto
// (Note [Bucket cap autotuning] in ddp/bucket_cap_tuner.h). What a user relies on: every rank
// ends with the same buckets, and training gives the bits it gives without either.
#include <cstring>
#include <memory>
#include <random>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "comm/exchange.h"
#include "core/error.h"
#include "ddp/distributed_data_parallel.h"
#include "model/loss.h"
#include "model/models.h"
#include "model/optimizer.h"
#include "tests/mpi/late_last_layer.h"
#include "tests/mpi/mpi_test_env.h"

namespace dtrain {
namespace {

using testing::LateLastLayer;
using testing::same_on_all_ranks;

Communicator& world() { return testing::test_comm(); }
Runtime& runtime() { return testing::test_runtime(); }

struct Training {
  std::unique_ptr<Module> model;
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<Optimizer> opt;
  CrossEntropyLoss loss;
  int steps = 0;

  Training(std::unique_ptr<Module> m, DdpOptions options) : model(std::move(m)) {
    ddp = std::make_unique<DistributedDataParallel>(*model, runtime(), options);
    opt = std::make_unique<Sgd>(model->parameters(), SgdOptions{0.05f, 0.9f, 0.f, 1e-4f, false});
  }
  void step() {
    auto [x, y] = testing::rank_batch(steps++);
    opt->zero_grad();
    loss.forward(ddp->forward(x), y);
    ddp->backward(loss.backward());
    opt->step();
  }
  std::vector<float> values() {
    std::vector<float> out;
    for (Parameter* p : model->parameters()) {
      auto v = p->value.to_vector();
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  }
};

// Every parameter in a bucket of its own, so the order decides the buckets.
DdpOptions one_parameter_per_bucket() {
  DdpOptions o;
  o.first_bucket_bytes = o.bucket_cap_bytes = 1;
  return o;
}

std::string plan_text(DistributedDataParallel& ddp) {
  std::string s;
  for (const GradBucket& b : ddp.reducer().buckets())
    s += fmt::format("[{}]", fmt::join(b.params, " "));
  return s;
}

TEST(BucketRebuild, RegroupsInRankZerosReadyOrderAfterStepOne) {
  // Rank 0's last layer is late; the other ranks' gradients come in the usual order. Every rank
  // must take rank 0's.
  Training run(std::make_unique<LateLastLayer>(7, world().rank() == 0), one_parameter_per_bucket());
  EXPECT_EQ(plan_text(*run.ddp), "[5][4][3][2][1][0]");
  EXPECT_FALSE(run.ddp->bucket_layout_final());
  run.step();
  EXPECT_TRUE(run.ddp->bucket_layout_final());
  EXPECT_EQ(run.ddp->bucket_layout().ready_order, (std::vector<size_t>{3, 2, 1, 0, 5, 4}));
  EXPECT_EQ(plan_text(*run.ddp), "[3][2][1][0][5][4]") << "rank " << world().rank();
  EXPECT_TRUE(same_on_all_ranks(plan_text(*run.ddp)));
  const std::vector<std::string> notes = run.ddp->take_bucket_notes();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("rebuilt after step 1"), std::string::npos) << notes[0];
  // Once: later steps keep it.
  for (int i = 0; i < 3; ++i) run.step();
  EXPECT_EQ(plan_text(*run.ddp), "[3][2][1][0][5][4]");
  EXPECT_TRUE(run.ddp->take_bucket_notes().empty());
}

TEST(BucketRebuild, ResultsAreBitwiseThoseWithoutTheRebuild) {
  Training rebuilt(std::make_unique<LateLastLayer>(7, true), one_parameter_per_bucket());
  DdpOptions fixed = one_parameter_per_bucket();
  fixed.rebuild_buckets = false;
  Training kept(std::make_unique<LateLastLayer>(7, true), fixed);
  // The step that rebuilds: the gradients move to their new places before the optimizer reads them.
  rebuilt.step();
  kept.step();
  ASSERT_NE(plan_text(*rebuilt.ddp), plan_text(*kept.ddp)) << "the rebuild did not happen";
  for (int i = 0; i < 5; ++i) rebuilt.step(), kept.step();
  const std::vector<float> a = rebuilt.values(), b = kept.values();
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
      << "regrouped buckets changed the parameters on rank " << world().rank();
  std::string bytes(reinterpret_cast<const char*>(a.data()), a.size() * sizeof(float));
  EXPECT_TRUE(same_on_all_ranks(bytes)) << "replicas differ";
}

TEST(BucketRebuild, AChainInReverseOrderKeepsItsBucketsAndLogsNothing) {
  Training run(std::make_unique<LateLastLayer>(7, false), one_parameter_per_bucket());
  run.step();
  EXPECT_TRUE(run.ddp->bucket_layout_final());
  EXPECT_EQ(plan_text(*run.ddp), "[5][4][3][2][1][0]");
  EXPECT_TRUE(run.ddp->take_bucket_notes().empty());
}

TEST(BucketRebuild, ARankZeroThatHasJoinedGivesNoOrder) {
  // Rank 0 is out of data at step 1 (Join): its shadow backward marks every parameter in
  // parameter order, which is no observation; the buckets stay as they were, on every rank.
  Training run(std::make_unique<LateLastLayer>(7, true), one_parameter_per_bucket());
  if (world().rank() == 0) {
    run.opt->zero_grad();
    run.ddp->join_backward();
    run.opt->step();
  } else {
    run.step();
  }
  EXPECT_TRUE(run.ddp->bucket_layout_final());
  EXPECT_EQ(plan_text(*run.ddp), "[5][4][3][2][1][0]") << "rank " << world().rank();
}

TEST(BucketRebuild, NotWithFindUnusedParameters) {
  DdpOptions o = one_parameter_per_bucket();
  o.find_unused_parameters = true;
  Training run(std::make_unique<LateLastLayer>(7, true), o);
  run.step();
  EXPECT_EQ(plan_text(*run.ddp), "[5][4][3][2][1][0]");
}

// Candidate 0 puts every parameter in a bucket of its own, candidate 1 all in one; candidate 2
// gives candidate 0's buckets again and must not be tried.
DdpOptions autotuned(std::function<double(size_t, double)> cost) {
  DdpOptions o;
  o.bucket_cap_auto = true;
  o.autotune_candidates = {{1, 1}, {size_t{1} << 20, size_t{1} << 20}, {2, 2}};
  o.autotune_warmup_steps = 1;
  o.autotune_measured_steps = 2;
  o.autotune_step_ms = std::move(cost);
  return o;
}

TEST(BucketCapAuto, EveryRankKeepsTheCandidateWhoseSlowestRankIsFastest) {
  // Rank 0 alone would keep candidate 0 (1 ms against 5); rank 1 is slow with it (10 ms against
  // 6). The step waits for the slowest rank, so candidate 1 (6 ms) must win on every rank.
  const int rank = world().rank();
  Training run(std::make_unique<LateLastLayer>(7, false), autotuned([rank](size_t candidate, double) {
            if (rank == 0) return candidate == 0 ? 1.0 : 5.0;
            if (rank == 1) return candidate == 0 ? 10.0 : 6.0;
            return 2.0;
          }));
  run.step();  // step 1: order agreed, candidate 0 in place
  EXPECT_FALSE(run.ddp->bucket_layout_final());
  EXPECT_EQ(plan_text(*run.ddp), "[5][4][3][2][1][0]");
  for (int i = 0; i < 3; ++i) run.step();  // candidate 0: one warm-up, two measured
  EXPECT_EQ(plan_text(*run.ddp), "[5 4 3 2 1 0]") << "candidate 1 is tried next";
  for (int i = 0; i < 2; ++i) run.step();
  EXPECT_FALSE(run.ddp->bucket_layout_final());
  run.step();  // candidate 1's last measured step: the choice (candidate 2 is candidate 0 again)
  ASSERT_TRUE(run.ddp->bucket_layout_final());
  EXPECT_EQ(run.ddp->bucket_layout().bucket_cap_bytes, size_t{1} << 20) << "rank " << rank;
  EXPECT_EQ(plan_text(*run.ddp), "[5 4 3 2 1 0]");
  EXPECT_TRUE(same_on_all_ranks(plan_text(*run.ddp)));
  const std::vector<std::string> notes = run.ddp->take_bucket_notes();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("chose a 1 MiB first bucket and a 1 MiB cap after step 7"), std::string::npos) << notes[0];
  EXPECT_NE(notes[0].find("10.000 ms"), std::string::npos) << "the slowest rank's figure: " << notes[0];
  // And it stays.
  for (int i = 0; i < 4; ++i) run.step();
  EXPECT_EQ(plan_text(*run.ddp), "[5 4 3 2 1 0]");
}

TEST(BucketCapAuto, ResultsAreBitwiseThoseOfAFixedCap) {
  Training tuned(std::make_unique<LateLastLayer>(7, false), autotuned({}));
  Training fixed(std::make_unique<LateLastLayer>(7, false), DdpOptions{});
  for (int i = 0; i < 10; ++i) tuned.step(), fixed.step();
  ASSERT_TRUE(tuned.ddp->bucket_layout_final());
  const std::vector<float> a = tuned.values(), b = fixed.values();
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  EXPECT_TRUE(same_on_all_ranks(plan_text(*tuned.ddp))) << "ranks chose differently from real timings";
}

TEST(BucketCapAuto, ALayoutFromACheckpointIsUsedWithoutTrials) {
  Training run(std::make_unique<LateLastLayer>(7, true), autotuned([](size_t, double) { return 1.0; }));
  const BucketLayout saved{{3, 2, 1, 0, 5, 4}, 1, size_t{1} << 20};  // order 3 2 1 0 5 4, first bucket 1 byte
  run.ddp->set_bucket_layout(saved);
  EXPECT_TRUE(run.ddp->bucket_layout_final());
  EXPECT_EQ(plan_text(*run.ddp), "[3][2 1 0 5 4]");
  for (int i = 0; i < 8; ++i) run.step();
  EXPECT_EQ(run.ddp->bucket_layout(), saved);
  EXPECT_TRUE(run.ddp->take_bucket_notes().empty());
  EXPECT_THROW(run.ddp->set_bucket_layout({{0, 1, 2}, 1, 1}), Error) << "a layout for another model";
}

}  // namespace
}  // namespace dtrain
