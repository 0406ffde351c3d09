// Pipeline parallelism at 2, 3 and 4 ranks (Note [Pipeline schedules], [Pipeline grid],
// [Pipeline loss]): every P x D grid the world allows (P = 2 and 3 alone, 2 x 2 and 4 x 1 at
// np 4) trains an MLP whose weights after N SGD steps equal the unsplit model's trained in one
// process on the same global batch (1e-5 relative), with the same losses; GPipe and 1F1B give
// the same weights bit for bit; fewer micro-batches than stages is refused in one line. With
// --clip-grad-norm (Note [Pipeline gradient norm]) and --amp fp16 (Note [Loss scaling]: an inf on
// one stage skips the step on every rank) the weights are the unsplit model's likewise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <utility>

#include "app/pipeline_zero.h"
#include "core/error.h"
#include "core/ops.h"
#include "ddp/loss_scaling.h"
#include "model/grad_clip.h"
#include "model/loss.h"
#include "model/models.h"
#include "model/optimizer.h"
#include "pipeline/partition.h"
#include "pipeline/pipeline_clip.h"
#include "pipeline/pipeline_stage.h"
#include "tests/mpi/collective_test_util.h"
#include "tests/mpi/mpi_test_env.h"
#include "tests/mpi/pipeline_mlp.h"
#include "tests/mpi/pipeline_test_util.h"

namespace dtrain {
namespace {

using testing::bitwise_equal_on_all_ranks;
using testing::error_of;
using testing::for_each_replicated_grid;
using testing::pipeline_grids;
using testing::test_comm;
using testing::worst_relative;
using namespace testing::pipeline_mlp;  // NOLINT: the test MLP, its stages and batches

constexpr int kSteps = 30;

// What a run adds to the plain SGD step: --clip-grad-norm, --amp fp16.
struct Extras {
  float clip = 0.f;  // > 0: clip the global gradient norm to this
  bool fp16 = false;  // fp16 GEMM operands, the loss scaled by a GradScaler (kScaler)
  // fp16: (step, world rank) whose gradient gets an inf after the gradient sums; the unsplit
  // model's run poisons each step listed, the pipeline only on that rank.
  std::vector<std::pair<int, int>> poisoned;
  int zero = 0;  // --zero 1 or 2 over each stage's replicas (Note [Pipeline ZeRO-1])
  std::vector<float> class_weights = {};  // --class-weights (Note [Pipeline class weights])
  // Note [Pipeline Join]: from this step on the last replica has no batch (-1: never); the
  // unsplit model trains on the other replicas' rows, its mean gradient times (D - 1) / D
  // (divide_by_initial_world_size; with class weights the weighted mean of the rows present).
  int joined_from = -1;
};

GradScalerSettings scaler_settings() {
  GradScalerSettings s;
  s.growth_interval = 6;  // the scale grows within the run too
  return s;
}

void poison_first_grad(Module& m) {
  m.parameters().front()->grad.data()[0] = std::numeric_limits<float>::infinity();
}

// The unsplit model trained in one process on each step's global batch: name -> values, losses.
struct Reference {
  std::map<std::string, std::vector<float>> weights;
  std::vector<float> losses;
  std::vector<float> norms;  // each taken step's gradient norm (with a clip)
  GradScalerState scaler;
};

Reference train_unsplit(int replicas, const Extras& x = {}) {
  auto model = make_mlp();
  if (x.fp16) model->set_amp(AmpMode::kFp16);
  Sgd opt(model->parameters(), sgd());
  std::optional<GradNormClipper> clipper;
  if (x.clip > 0.f) clipper.emplace(model->parameters());
  GradScaler scaler(scaler_settings(), Device::cpu());
  CrossEntropyLoss loss(Reduction::kMean, x.class_weights);
  Reference ref;
  for (int step = 0; step < kSteps; ++step) {
    const bool short_step = x.joined_from >= 0 && step >= x.joined_from;
    const Batch whole = global_batch(step, replicas);
    const Batch b = short_step ? rows_of(whole, 0, (replicas - 1) * kRowsPerReplica) : whole;
    opt.zero_grad();
    ref.losses.push_back(loss_value(loss.forward(model->forward(b.x), b.y)));
    Tensor g = loss.backward();
    if (short_step && x.class_weights.empty()) scale(g, static_cast<float>(replicas - 1) / static_cast<float>(replicas));
    if (x.fp16) scale(g, scaler.scale());
    model->backward(g, false);
    if (x.fp16) {
      for (const auto& [s, rank] : x.poisoned)
        if (s == step) poison_first_grad(*model);
      scaler.unscale(written_grads(model->parameters()));
      if (!scaler.update(scaler.read_found_inf() > 0.f)) continue;
    }
    if (clipper) {
      clipper->clip(x.clip);
      ref.norms.push_back(clipper->last_norm());
    }
    opt.step();
  }
  for (Parameter* p : model->parameters()) ref.weights[p->name] = p->value.to_vector();
  ref.scaler = scaler.state();
  return ref;
}

struct PipelineRun {
  std::map<std::string, std::vector<float>> weights;  // this stage's
  std::vector<float> losses;                          // the last stage's, averaged over replicas
  int peak_held = 0;
  std::vector<float> norms;  // each taken step's global gradient norm (with a clip)
  GradScalerState scaler;
  size_t state_bytes = 0;  // the optimizer's
};

// `accumulate` pipeline steps per optimizer step, each of this replica's rows / accumulate.
// With `x`, as app/pipeline_trainer.cpp: the fp16 vote over the world, then the clip over the
// pipeline's stages, then the step.
PipelineRun train_pipeline(PipelineGrid& grid, PipelineSchedule schedule, int micro_batches, int accumulate = 1,
                           const Extras& x = {}) {
  PipelineOptions options{schedule, micro_batches};
  options.sum_gradients = x.zero != 2;  // ZeRO-2 reduce-scatters them after the step's backwards
  options.class_weights = x.class_weights;
  PipelineStage stage(stage_of(grid.stages, grid.stage), grid, options);
  if (x.fp16) stage.module().set_amp(AmpMode::kFp16);
  Sgd opt(stage.module().parameters(), sgd());
  std::optional<StageZero> zero;
  if (x.zero > 0) zero.emplace(stage.module(), grid, x.zero == 2);
  std::optional<PipelineClipper> clipper;
  if (x.clip > 0.f) clipper.emplace(test_comm(), stage);
  LossScaling scaling(test_comm(), scaler_settings(), Device::cpu());
  const float loss_scale = x.fp16 ? scaling.scale() : 1.f;
  PipelineRun run;
  for (int step = 0; step < kSteps; ++step) {
    Batch mine = rows_of(global_batch(step, grid.replicas), grid.replica * kRowsPerReplica, kRowsPerReplica);
    // Note [Pipeline Join]: the last replica's stages run the step on zeros.
    const bool joined = x.joined_from >= 0 && step >= x.joined_from && grid.replica == grid.replicas - 1;
    if (joined) mine = {Tensor::zeros(mine.x.shape()), Tensor::zeros(mine.y.shape(), Device::cpu(), DType::kI32)};
    opt.zero_grad();
    const int64_t rows = kRowsPerReplica / accumulate;
    float loss = 0;
    for (int a = 0; a < accumulate; ++a) {
      const Batch part = rows_of(mine, a * rows, rows);
      loss += stage.train_step(part.x, part.y, {a, accumulate, x.fp16 ? scaling.scale() : loss_scale, joined}).loss /
              static_cast<float>(accumulate);
    }
    if (x.zero == 2) zero->reduce_scatter_gradients();
    if (grid.stage == grid.stages - 1) grid.data_parallel->allreduce(&loss, 1, DType::kF32, ReduceOp::kAvg);
    run.losses.push_back(loss);
    if (x.fp16) {
      for (const auto& [s, rank] : x.poisoned)
        if (s == step && rank == test_comm().rank()) poison_first_grad(stage.module());
      if (!scaling.unscale_and_agree(written_grads(stage.module().parameters()))) continue;
    }
    if (clipper) {
      clipper->clip(x.clip);
      run.norms.push_back(clipper->last_norm());
    }
    opt.step();
  }
  for (Parameter* p : stage.module().parameters()) run.weights[p->name] = p->value.to_vector();
  run.peak_held = stage.peak_held_inputs();
  run.scaler = scaling.scaler().state();
  run.state_bytes = opt.state_bytes();
  if (clipper) clipper->shutdown();
  return run;
}

TEST(Pipeline, EveryGridsWeightsAfterNStepsEqualTheUnsplitModelsAndGpipeEquals1f1bBitForBit) {
  for (int stages : pipeline_grids()) {
    PipelineGrid grid = make_pipeline_grid(test_comm(), stages);
    const Reference ref = train_unsplit(grid.replicas);
    const int M = 4;  // >= P for every grid here, and divides kRowsPerReplica
    const PipelineRun f1b = train_pipeline(grid, PipelineSchedule::k1f1b, M);
    const PipelineRun gpipe = train_pipeline(grid, PipelineSchedule::kGpipe, M);
    SCOPED_TRACE(fmt::format("P {} x D {}, M {}, stage {}", stages, grid.replicas, M, grid.stage));
    EXPECT_FALSE(f1b.weights.empty());
    const double worst = worst_relative(f1b.weights, ref.weights);
    EXPECT_LT(worst, 1e-5);
    // Not vacuous: the weights moved away from the initial ones by far more than that.
    const auto initial = [&] {
      std::map<std::string, std::vector<float>> w;
      auto fresh = make_mlp();  // alive through the loop (a temporary in the range would not be)
      for (Parameter* p : fresh->parameters()) w[p->name] = p->value.to_vector();
      return w;
    }();
    EXPECT_GT(worst_relative(f1b.weights, initial), 1e-2);
    if (test_comm().rank() == 0) std::printf("P %d x D %d: worst relative difference %.3g\n", stages, grid.replicas, worst);
    EXPECT_TRUE(f1b.weights == gpipe.weights) << "GPipe and 1F1B must sum the micro-batches in one order";
    if (grid.stage == stages - 1) {
      for (int s = 0; s < kSteps; ++s)
        EXPECT_NEAR(f1b.losses[static_cast<size_t>(s)], ref.losses[static_cast<size_t>(s)],
                    1e-5 * std::fabs(ref.losses[static_cast<size_t>(s)]))
            << "step " << s;
    }
    EXPECT_EQ(gpipe.peak_held, M);
    EXPECT_EQ(f1b.peak_held, stages - grid.stage);
    grid.chain->shutdown();
    grid.data_parallel->shutdown();
  }
}

// --accumulate 2 (Note [Pipeline loss]): two pipeline steps of half the rows per optimizer step,
// the replicas' gradient sum on the second only, equal the unsplit model on the whole batch.
TEST(Pipeline, AccumulatedPipelineStepsEqualTheUnsplitModelOnTheSameGlobalBatch) {
  for (int stages : pipeline_grids()) {
    PipelineGrid grid = make_pipeline_grid(test_comm(), stages);
    const Reference ref = train_unsplit(grid.replicas);
    const PipelineRun run = train_pipeline(grid, PipelineSchedule::k1f1b, 4, /*accumulate=*/2);
    SCOPED_TRACE(fmt::format("P {} x D {}, accumulate 2, stage {}", stages, grid.replicas, grid.stage));
    EXPECT_FALSE(run.weights.empty());
    const double worst = worst_relative(run.weights, ref.weights);
    EXPECT_LT(worst, 1e-5);
    if (test_comm().rank() == 0)
      std::printf("P %d x D %d, accumulate 2: worst relative difference %.3g\n", stages, grid.replicas, worst);
    grid.chain->shutdown();
    grid.data_parallel->shutdown();
  }
}

// Expects `got`'s norms each within 1e-5 of `want`'s; returns how many of `want`'s exceed `limit`
// (the steps that clipped).
int norms_match_and_clipped(const std::vector<float>& got, const std::vector<float>& want, float limit) {
  EXPECT_EQ(got.size(), want.size());
  int clipped = 0;
  for (size_t s = 0; s < std::min(got.size(), want.size()); ++s) {
    EXPECT_NEAR(got[s], want[s], 1e-5 * want[s]) << "step " << s;
    clipped += want[s] > limit;
  }
  return clipped;
}

// --class-weights (Note [Pipeline class weights]): the loss is the weighted mean over the GLOBAL
// batch (every micro-batch and replica), so the weights and the losses are the unsplit model's
// with CrossEntropyLoss(weight=...) on the D x B rows; a mean of per-micro-batch weighted means
// (or per replica) would not be.
TEST(Pipeline, ClassWeightedLossIsTheGlobalBatchsWeightedMeanAsTheUnsplitModels) {
  Extras x;
  x.class_weights = {0.5f, 2.f, 1.f, 0.f, 3.f, 1.f, 1.5f, 0.25f, 1.f, 4.f};
  for (int stages : pipeline_grids()) {
    PipelineGrid grid = make_pipeline_grid(test_comm(), stages);
    const Reference ref = train_unsplit(grid.replicas, x);
    const PipelineRun f1b = train_pipeline(grid, PipelineSchedule::k1f1b, 4, 1, x);
    const PipelineRun gpipe = train_pipeline(grid, PipelineSchedule::kGpipe, 4, 1, x);
    SCOPED_TRACE(fmt::format("P {} x D {}, class weights, stage {}", stages, grid.replicas, grid.stage));
    EXPECT_FALSE(f1b.weights.empty());
    const double worst = worst_relative(f1b.weights, ref.weights);
    EXPECT_LT(worst, 1e-5);
    EXPECT_TRUE(f1b.weights == gpipe.weights);
    if (grid.stage == stages - 1) {
      for (int s = 0; s < kSteps; ++s)
        EXPECT_NEAR(f1b.losses[static_cast<size_t>(s)], ref.losses[static_cast<size_t>(s)],
                    1e-5 * std::fabs(ref.losses[static_cast<size_t>(s)]))
            << "step " << s;
    }
    // Not vacuous: the weights change the result by far more than the tolerance.
    EXPECT_GT(worst_relative(ref.weights, train_unsplit(grid.replicas).weights), 1e-3);
    if (test_comm().rank() == 0)
      std::printf("P %d x D %d, class weights: worst relative difference %.3g\n", stages, grid.replicas, worst);
    grid.chain->shutdown();
    grid.data_parallel->shutdown();
  }
}

// --sampler uneven (Note [Pipeline Join]): from step 24 on the last replica has no batch and its
// stages run joined steps (zeros in, a zero loss gradient): every sum over the replicas happens,
// and the weights are the unsplit model's on the other replicas' rows with the gradient times
// (D - 1) / D (PyTorch DDP + Join's divide_by_initial_world_size), within 1e-5; with class
// weights (the joined replica adds no weight) and with --zero 2 too. Grids with D > 1 only.
TEST(Pipeline, UnevenInputsJoinedReplicasShadowTheirStepsAsTheUnsplitModelOnTheRowsPresent) {
  const int grids = for_each_replicated_grid([](PipelineGrid& grid) {
    const int stages = grid.stages;
    Extras plain, weighted, zero;
    plain.joined_from = weighted.joined_from = zero.joined_from = kSteps - 6;
    weighted.class_weights = {0.5f, 2.f, 1.f, 0.f, 3.f, 1.f, 1.5f, 0.25f, 1.f, 4.f};
    zero.zero = 2;
    for (const auto& [name, x] : std::vector<std::pair<const char*, Extras>>{
             {"plain", plain}, {"class weights", weighted}, {"--zero 2", zero}}) {
      SCOPED_TRACE(fmt::format("P {} x D {}, uneven ({}), stage {}", stages, grid.replicas, name, grid.stage));
      const Reference ref = train_unsplit(grid.replicas, x);
      const PipelineRun run = train_pipeline(grid, PipelineSchedule::k1f1b, 4, 1, x);
      EXPECT_FALSE(run.weights.empty());
      const double worst = worst_relative(run.weights, ref.weights);
      EXPECT_LT(worst, 1e-5);
      // Not vacuous: the short steps are not the full batch's.
      Extras full = x;
      full.joined_from = -1;
      EXPECT_GT(worst_relative(ref.weights, train_unsplit(grid.replicas, full).weights), 1e-4);
      // Every replica of a stage holds the same bits, the joined one too.
      std::vector<float> flat;
      for (const auto& [n, w] : run.weights) flat.insert(flat.end(), w.begin(), w.end());
      std::vector<float> root = flat;
      grid.data_parallel->broadcast(root.data(), static_cast<int64_t>(root.size()), DType::kF32, 0);
      EXPECT_TRUE(root == flat) << "the stage's replicas differ";
      if (test_comm().rank() == 0)
        std::printf("P %d x D %d, uneven (%s): worst relative difference %.3g\n", stages, grid.replicas, name, worst);
    }
  });
  if (grids == 0) GTEST_SKIP() << "no grid with more than one replica at np " << test_comm().size();
}

// --clip-grad-norm (Note [Pipeline gradient norm]): the norm is the whole model's, over every
// stage's gradients, and every rank of the world scales by the same coefficient, so the weights
// are the clipped unsplit model's.
TEST(Pipeline, ClippingOverEveryStagesGradientsEqualsTheClippedUnsplitModel) {
  for (int stages : pipeline_grids()) {
    PipelineGrid grid = make_pipeline_grid(test_comm(), stages);
    // The limit: the unclipped run's median norm (a limit never reached leaves the bits alone),
    // so about half the steps clip.
    std::vector<float> norms = train_unsplit(grid.replicas, {1e30f, false, {}}).norms;
    std::nth_element(norms.begin(), norms.begin() + kSteps / 2, norms.end());
    const float kMaxNorm = norms[kSteps / 2];
    const Extras x{kMaxNorm, false, {}};
    const Reference ref = train_unsplit(grid.replicas, x);
    const PipelineRun run = train_pipeline(grid, PipelineSchedule::k1f1b, 4, 1, x);
    SCOPED_TRACE(fmt::format("P {} x D {}, clip {}, stage {}", stages, grid.replicas, kMaxNorm, grid.stage));
    const double worst = worst_relative(run.weights, ref.weights);
    EXPECT_LT(worst, 1e-5);
    const int clipped = norms_match_and_clipped(run.norms, ref.norms, kMaxNorm);
    EXPECT_TRUE(bitwise_equal_on_all_ranks(run.norms)) << "every rank must take the same decision";
    // Not vacuous: some steps clipped, some not, and the clipped run is far from the unclipped one.
    EXPECT_GT(clipped, 0);
    EXPECT_LT(clipped, kSteps);
    EXPECT_GT(worst_relative(ref.weights, train_unsplit(grid.replicas).weights), 1e-3);
    if (test_comm().rank() == 0)
      std::printf("P %d x D %d, clip %g: %d of %d steps clipped, worst relative difference %.3g\n", stages,
                  grid.replicas, kMaxNorm, clipped, kSteps, worst);
    grid.chain->shutdown();
    grid.data_parallel->shutdown();
  }
}

// --amp fp16 (Note [Loss scaling]): the last stage's loss gradient is scaled, so are the
// activation gradients sent down the chain; an inf on ONE rank (the last stage of the last
// replica, then stage 0 of replica 0) skips the step on EVERY rank of the world, and the weights
// and the scaler's state are the unsplit fp16 run's, which skips the same steps.
TEST(Pipeline, Fp16InfOnOneStageSkipsTheStepOnEveryRankAsTheUnsplitModelDoes) {
  const int last_rank = test_comm().size() - 1;
  const Extras x{0.f, true, {{5, last_rank}, {11, 0}}};
  const Extras clean{0.f, true, {}};
  for (int stages : pipeline_grids()) {
    PipelineGrid grid = make_pipeline_grid(test_comm(), stages);
    const Reference ref = train_unsplit(grid.replicas, x);
    const PipelineRun run = train_pipeline(grid, PipelineSchedule::k1f1b, 4, 1, x);
    SCOPED_TRACE(fmt::format("P {} x D {}, fp16, stage {}", stages, grid.replicas, grid.stage));
    EXPECT_EQ(run.scaler, ref.scaler) << "scale " << run.scaler.scale << " vs " << ref.scaler.scale << ", skipped "
                                      << run.scaler.skipped_steps << " vs " << ref.scaler.skipped_steps;
    EXPECT_EQ(ref.scaler.skipped_steps, 2);
    const double worst = worst_relative(run.weights, ref.weights);
    EXPECT_LT(worst, 1e-5);
    std::vector<float> scale = {run.scaler.scale, static_cast<float>(run.scaler.skipped_steps)};
    EXPECT_TRUE(bitwise_equal_on_all_ranks(scale));
    // Not vacuous: the skipped steps moved the weights away from a run that took them.
    EXPECT_GT(worst_relative(ref.weights, train_unsplit(grid.replicas, clean).weights), 1e-3);
    if (test_comm().rank() == 0)
      std::printf("P %d x D %d, fp16: scale %g, %lld skipped, worst relative difference %.3g\n", stages,
                  grid.replicas, run.scaler.scale, static_cast<long long>(run.scaler.skipped_steps), worst);
    grid.chain->shutdown();
    grid.data_parallel->shutdown();
  }
}

// --zero 1 (Note [Pipeline ZeRO-1]): each stage's optimizer state sharded over its D replicas,
// the updated chunks all-gathered; the weights are the unsharded pipeline's bit for bit (each
// element's update reads the same gradient and state). Grids with D > 1 only (2 x 2 at np 4).
TEST(Pipeline, ZeroOneShardsEachStagesOptimizerStateAndEqualsTheUnshardedPipelineBitForBit) {
  const int grids = for_each_replicated_grid([](PipelineGrid& grid) {
    const int stages = grid.stages;
    // --zero 2 also reduce-scatters the gradients: with --accumulate 2 too (the sums after
    // both pipeline steps' backwards).
    for (const auto& [z, accumulate] : std::vector<std::pair<int, int>>{{1, 1}, {2, 1}, {2, 2}}) {
      SCOPED_TRACE(fmt::format("P {} x D {}, --zero {}, --accumulate {}, stage {}", stages, grid.replicas, z,
                               accumulate, grid.stage));
      const PipelineRun plain = train_pipeline(grid, PipelineSchedule::k1f1b, 4, accumulate);
      Extras x;
      x.zero = z;
      const PipelineRun zero = train_pipeline(grid, PipelineSchedule::k1f1b, 4, accumulate, x);
      EXPECT_FALSE(zero.weights.empty());
      EXPECT_TRUE(zero.weights == plain.weights) << "worst relative difference "
                                                 << worst_relative(zero.weights, plain.weights);
      // SGD's momentum: this replica's 1/D of the stage's (padded) flat space.
      EXPECT_LE(zero.state_bytes, plain.state_bytes / static_cast<size_t>(grid.replicas) + 64);
      EXPECT_GT(zero.state_bytes, 0u);
      if (test_comm().rank() == 0)
        std::printf("P %d x D %d, --zero %d, --accumulate %d: optimizer state %zu of %zu bytes, weights bit for bit\n",
                    stages, grid.replicas, z, accumulate, zero.state_bytes, plain.state_bytes);
    }
  });
  if (grids == 0) GTEST_SKIP() << "no grid with more than one replica at np " << test_comm().size();
}

// --zero 2 with --clip-grad-norm: a replica holds the sums of its chunk only, so the norm adds its
// chunk's squares over the stage's replicas, then over the stages; every rank takes the same
// decision, and the weights are the unsharded clipped pipeline's (within 1e-5: another order of
// sums, not bitwise), with --accumulate 2 too. Grids with D > 1 only (2 x 2 at np 4).
TEST(Pipeline, ZeroTwoWithClippingTakesTheWholeModelsNormAndEqualsTheUnshardedClippedPipeline) {
  const int grids = for_each_replicated_grid([](PipelineGrid& grid) {
    const int stages = grid.stages;
    std::vector<float> norms = train_unsplit(grid.replicas, {1e30f, false, {}}).norms;
    std::nth_element(norms.begin(), norms.begin() + kSteps / 2, norms.end());
    Extras x{norms[kSteps / 2], false, {}};  // about half the steps clip
    for (int accumulate : {1, 2}) {
      SCOPED_TRACE(fmt::format("P {} x D {}, --zero 2, clip {}, --accumulate {}, stage {}", stages, grid.replicas,
                               x.clip, accumulate, grid.stage));
      x.zero = 0;
      const PipelineRun plain = train_pipeline(grid, PipelineSchedule::k1f1b, 4, accumulate, x);
      x.zero = 2;
      const PipelineRun zero = train_pipeline(grid, PipelineSchedule::k1f1b, 4, accumulate, x);
      EXPECT_FALSE(zero.weights.empty());
      const double worst = worst_relative(zero.weights, plain.weights);
      EXPECT_LT(worst, 1e-5);
      const int clipped = norms_match_and_clipped(zero.norms, plain.norms, x.clip);
      EXPECT_TRUE(bitwise_equal_on_all_ranks(zero.norms)) << "every rank must take the same decision";
      EXPECT_GT(clipped, 0);
      EXPECT_LT(clipped, kSteps);
      if (test_comm().rank() == 0)
        std::printf("P %d x D %d, --zero 2, clip %g, --accumulate %d: %d of %d steps clipped, worst relative "
                    "difference %.3g\n",
                    stages, grid.replicas, x.clip, accumulate, clipped, kSteps, worst);
    }
  });
  if (grids == 0) GTEST_SKIP() << "no grid with more than one replica at np " << test_comm().size();
}

// --model resnet18 (Note [Pipeline BatchNorm], Note [ResNet pipeline stages]): each micro-batch
// normalised on its own rows, the running statistics moved once per micro-batch forward (not by
// the shape probe or the recomputations), each stage's replicas starting every step from replica
// 0's: replica 0's weights and statistics are the unsplit ResNet's trained on the same rows with
// the micro-batches accumulated (the other replicas' forwards leaving its statistics alone, as
// DDP's buffer broadcast does), bit for bit (the reference adds the replicas' gradients in the
// all-reduce's order: BatchNorm over a few values amplifies another order's rounding to 1e-2);
// GPipe = 1F1B bit for bit.
ModelSpec small_resnet() {
  ModelSpec spec;
  spec.kind = ModelKind::kResnet18;
  spec.width = 4;
  return spec;
}

std::map<std::string, std::vector<float>> state_of(Module& m) {
  std::map<std::string, std::vector<float>> out;
  for (Parameter* p : m.parameters()) out[p->name] = p->value.to_vector();
  for (Buffer* b : m.buffers())
    if (b->value.dtype() == DType::kF32) out[b->name] = b->value.to_vector();
  return out;
}

constexpr int kResnetSteps = 8;
const Shape kImage = {1, 16, 16};  // layer4 at 2x2: a micro-batch's statistics over 2 rows x 4 pixels

// Step `step`'s global batch of kImage samples (replicas x kRowsPerReplica rows).
Batch image_batch(int step, int replicas) {
  const int64_t rows = kRowsPerReplica * replicas, per = shape_numel(kImage);
  std::mt19937 gen(2000 + static_cast<uint32_t>(step));
  std::uniform_real_distribution<float> px(0.f, 1.f);
  std::uniform_int_distribution<int> cls(0, 9);
  std::vector<float> x(static_cast<size_t>(rows * per));
  for (float& v : x) v = px(gen);
  Batch b{Tensor::from_vector(x, {rows, 1, 16, 16}), Tensor::empty({rows}, Device::cpu(), DType::kI32)};
  for (int64_t i = 0; i < rows; ++i) b.y.data_as<int32_t>()[i] = cls(gen);
  return b;
}

Batch image_rows(const Batch& b, int64_t first, int64_t count) {
  const int64_t per = shape_numel(kImage);
  return {b.x.slice(first * per, {count, 1, 16, 16}), b.y.slice(first, {count})};
}

std::map<std::string, std::vector<float>> train_unsplit_resnet(int replicas, int micro_batches) {
  auto model = build_model(small_resnet(), kImage, 10, Device::cpu(), /*seed=*/7);
  Sgd opt(model->parameters(), sgd());
  CrossEntropyLoss loss;
  const int64_t rows = kRowsPerReplica / micro_batches;
  for (int step = 0; step < kResnetSteps; ++step) {
    const Batch b = image_batch(step, replicas);
    // Each replica's accumulated gradient apart, then added in replica order, as the stage's
    // all-reduce adds them (BatchNorm over a few values amplifies another order's rounding).
    std::vector<std::vector<float>> sums(model->parameters().size());
    for (int d = replicas - 1; d >= 0; --d) {  // replica 0's forwards last: its statistics stay
      opt.zero_grad();
      std::vector<Tensor> saved;
      for (Buffer* buf : model->buffers()) {
        saved.push_back(Tensor::empty(buf->value.shape(), buf->value.device(), buf->value.dtype()));
        saved.back().copy_from(buf->value);
      }
      for (int m = 0; m < micro_batches; ++m) {
        const Batch part = image_rows(b, d * kRowsPerReplica + m * rows, rows);
        loss.forward(model->forward(part.x), part.y);
        Tensor g = loss.backward();
        scale(g, 1.f / static_cast<float>(micro_batches * replicas));
        model->backward(g, false);
      }
      if (d > 0) {
        size_t i = 0;
        for (Buffer* buf : model->buffers()) buf->value.copy_from(saved.at(i++));
      }
      size_t i = 0;
      for (Parameter* p : model->parameters()) {
        const std::vector<float> g = p->grad.to_vector();
        std::vector<float>& sum = sums[i++];
        if (sum.empty()) sum = g;
        else for (size_t k = 0; k < g.size(); ++k) sum[k] = g[k] + sum[k];  // replica d's + those after it
      }
    }
    size_t i = 0;
    for (Parameter* p : model->parameters()) p->grad.copy_from(Tensor::from_vector(sums[i++], p->grad.shape()));
    opt.step();
  }
  return state_of(*model);
}

std::map<std::string, std::vector<float>> train_resnet_pipeline(PipelineGrid& grid, PipelineSchedule schedule,
                                                                int micro_batches) {
  const std::vector<int64_t> counts = layer_parameter_counts(small_resnet(), kImage, 10);
  const StageRange range = balanced_partition(counts, grid.stages)[static_cast<size_t>(grid.stage)];
  PipelineStage stage(build_model(small_resnet(), kImage, 10, Device::cpu(), 7, LayerRange{range.begin, range.end}),
                      grid, {schedule, micro_batches});
  Sgd opt(stage.module().parameters(), sgd());
  for (int step = 0; step < kResnetSteps; ++step) {
    const Batch mine = image_rows(image_batch(step, grid.replicas), grid.replica * kRowsPerReplica, kRowsPerReplica);
    opt.zero_grad();
    stage.train_step(mine.x, mine.y);
    opt.step();
  }
  return state_of(stage.module());
}

TEST(Pipeline, ResnetStagesNormaliseEachMicroBatchAndKeepReplicaZerosStatisticsAsTheUnsplitModel) {
  EXPECT_EQ(layer_parameter_counts(small_resnet(), kImage, 10).size(), 8u);  // conv1 bn1 layer1-4 avgpool fc
  for (int stages : pipeline_grids()) {
    if (stages > 4) continue;
    PipelineGrid grid = make_pipeline_grid(test_comm(), stages);
    SCOPED_TRACE(fmt::format("resnet18 P {} x D {}, stage {}", stages, grid.replicas, grid.stage));
    const auto ref = train_unsplit_resnet(grid.replicas, 4);
    const auto f1b = train_resnet_pipeline(grid, PipelineSchedule::k1f1b, 4);
    const auto gpipe = train_resnet_pipeline(grid, PipelineSchedule::kGpipe, 4);
    ASSERT_FALSE(f1b.empty());
    EXPECT_TRUE(f1b == gpipe);
    {  // every replica of a stage the same weights (each its own statistics since the step's start)
      std::vector<float> flat;
      for (const auto& [n, w] : f1b)
        if (n.find("running_") == std::string::npos) flat.insert(flat.end(), w.begin(), w.end());
      std::vector<float> root = flat;
      grid.data_parallel->broadcast(root.data(), static_cast<int64_t>(root.size()), DType::kF32, 0);
      EXPECT_TRUE(root == flat) << "the stage's replicas differ";
    }
    if (grid.replica == 0) {
      const double worst = worst_relative(f1b, ref);
      EXPECT_EQ(worst, 0.0);
      std::printf("resnet18 P %d x D %d, stage %d: worst relative difference %.3g (weights and running statistics)\n",
                  stages, grid.replicas, grid.stage, worst);
    }
    // Not vacuous: the statistics moved from their start, and per micro-batch differs from per batch.
    auto fresh = build_model(small_resnet(), kImage, 10, Device::cpu(), 7);
    EXPECT_GT(worst_relative(ref, state_of(*fresh)), 1e-2);
    EXPECT_GT(worst_relative(ref, train_unsplit_resnet(grid.replicas, 1)), 1e-4);
    grid.chain->shutdown();
    grid.data_parallel->shutdown();
  }
}

// A communicator that forwards to another and records what went over it: each op's dtype and
// element count, by kind. Stands in for the NCCL communicators on CPU.
class Recording final : public Communicator {
 public:
  explicit Recording(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  int local_rank() const override { return inner_->local_rank(); }
  int local_size() const override { return inner_->local_size(); }
  std::string backend() const override { return inner_->backend(); }
  Stream& stream() override { return inner_->stream(); }
  WorkHandle allreduce_async(void* buf, int64_t count, DType dtype, ReduceOp op) override {
    note("allreduce", dtype, count);
    return inner_->allreduce_async(buf, count, dtype, op);
  }
  WorkHandle broadcast_async(void* buf, int64_t count, DType dtype, int root) override {
    note("broadcast", dtype, count);
    return inner_->broadcast_async(buf, count, dtype, root);
  }
  WorkHandle allgather_async(const void* send, void* recv, int64_t count, DType dtype) override {
    note("allgather", dtype, count);
    return inner_->allgather_async(send, recv, count, dtype);
  }
  WorkHandle reduce_scatter_async(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override {
    note("reduce_scatter", dtype, count);
    return inner_->reduce_scatter_async(send, recv, count, dtype, op);
  }
  WorkHandle barrier_async() override { return inner_->barrier_async(); }
  WorkHandle batch_p2p_async(std::vector<P2pOp> ops) override {
    for (const P2pOp& op : ops) note(op.kind == P2pOp::kSend ? "send" : "recv", op.dtype, op.count);
    return inner_->batch_p2p_async(std::move(ops));
  }
  void shutdown() override { inner_->shutdown(); }

  // "send float32" -> the ops' elements, summed.
  std::map<std::string, int64_t> elements;
  int64_t largest_count = 0;

 private:
  void note(const char* kind, DType dtype, int64_t count) {
    elements[fmt::format("{} {}", kind, dtype_name(dtype))] += count;
    largest_count = std::max(largest_count, count);
  }
  std::unique_ptr<Communicator> inner_;
};

// A few steps and one evaluation: this stage's weights and evaluation loss sum.
std::pair<std::map<std::string, std::vector<float>>, double> train_and_evaluate(PipelineGrid& grid) {
  PipelineStage stage(stage_of(grid.stages, grid.stage), grid, {PipelineSchedule::k1f1b, 4});
  Sgd opt(stage.module().parameters(), sgd());
  for (int step = 0; step < 3; ++step) {
    const Batch mine = rows_of(global_batch(step, grid.replicas), grid.replica * kRowsPerReplica, kRowsPerReplica);
    opt.zero_grad();
    stage.train_step(mine.x, mine.y);
    opt.step();
  }
  const Batch test = global_batch(99, 1);
  const double loss = stage.evaluate_batch(test.x, test.y).loss_sum;
  std::map<std::string, std::vector<float>> weights;
  for (Parameter* p : stage.module().parameters()) weights[p->name] = p->value.to_vector();
  return {weights, loss};
}

// Note [Pipeline on a GPU] (pipeline/grid.h): with device communicators (NCCL on a GPU; here
// recording MPI ones, so it runs on CPU), every tensor (activations, their gradients, evaluation
// activations, gradient sums, the parameter broadcast) travels on them, the host chain carries
// only the int32 shapes and the host group nothing but the caller's own one-value sums; the
// weights and the evaluation are the plain grid's bit for bit.
TEST(Pipeline, WithDeviceCommunicatorsTensorsTravelOnThemAndShapesOnTheHostChain) {
  for (int stages : pipeline_grids()) {
    PipelineGrid plain = make_pipeline_grid(test_comm(), stages);
    const auto want = train_and_evaluate(plain);
    shutdown_grid(plain);
    std::vector<std::string> made;
    PipelineGrid grid = make_pipeline_grid(test_comm(), stages, [&](Communicator& group, const std::string& name) {
      made.push_back(name);
      return std::make_unique<Recording>(group.split(0, group.rank(), name));
    });
    SCOPED_TRACE(fmt::format("P {} x D {}, stage {}", stages, grid.replicas, grid.stage));
    EXPECT_EQ(made, (std::vector<std::string>{fmt::format("nccl-stage{}", grid.stage),
                                              fmt::format("nccl-pipeline{}", grid.replica)}));
    EXPECT_EQ(&grid.tensor_chain(), grid.device_chain.get());
    EXPECT_EQ(&grid.tensor_group(), grid.device_data_parallel.get());
    auto host_chain = std::make_unique<Recording>(std::move(grid.chain));
    auto host_group = std::make_unique<Recording>(std::move(grid.data_parallel));
    const Recording& chain = *host_chain;
    const Recording& group = *host_group;
    grid.chain = std::move(host_chain);
    grid.data_parallel = std::move(host_group);
    const auto got = train_and_evaluate(grid);
    EXPECT_TRUE(got.first == want.first) << "worst relative difference " << worst_relative(got.first, want.first);
    EXPECT_EQ(got.second, want.second);
    const auto& device_chain = static_cast<const Recording&>(*grid.device_chain).elements;
    const auto& device_group = static_cast<const Recording&>(*grid.device_data_parallel).elements;
    for (const auto& [op, n] : chain.elements) EXPECT_TRUE(op == "send int32" || op == "recv int32") << op << " " << n;
    EXPECT_FALSE(chain.elements.empty());
    EXPECT_TRUE(group.elements.empty());
    // Stage 0 sends activations and receives their gradients, the last stage the other way round.
    EXPECT_GT(device_chain.count("send float32"), 0u);
    EXPECT_GT(device_chain.count("recv float32"), 0u);
    for (const auto& [op, n] : device_chain) EXPECT_TRUE(op.find("float32") != std::string::npos) << op;
    if (grid.replicas > 1) {
      EXPECT_GT(device_group.count("broadcast float32"), 0u);
      EXPECT_GT(device_group.count("allreduce float32"), 0u);
    } else {
      EXPECT_TRUE(device_group.empty());
    }
    shutdown_grid(grid);
  }
}

TEST(Pipeline, FewerMicroBatchesThanStagesIsRefusedInOneLine) {
  const int stages = test_comm().size();
  PipelineGrid grid = make_pipeline_grid(test_comm(), stages);
  const std::string error = error_of([&] { PipelineStage(stage_of(stages, grid.stage), grid, {PipelineSchedule::k1f1b, stages - 1}); });
  EXPECT_EQ(error, fmt::format("{} micro-batches are fewer than the {} pipeline stages: every stage needs a "
                               "micro-batch in flight (use at least {})",
                               stages - 1, stages, stages));
  grid.chain->shutdown();
  grid.data_parallel->shutdown();
}

TEST(Pipeline, AGridThatDoesNotDivideTheWorldIsRefusedInOneLine) {
  const int n = test_comm().size();
  EXPECT_EQ(pipeline_grid_problem(n, n + 1).rfind(fmt::format("{} pipeline stages do not divide the {} rank(s)", n + 1, n), 0), 0u);
  EXPECT_THROW(make_pipeline_grid(test_comm(), n + 1), Error);
}

}  // namespace
}  // namespace dtrain
