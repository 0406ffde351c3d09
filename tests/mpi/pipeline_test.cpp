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
  CrossEntropyLoss loss;
  Reference ref;
  for (int step = 0; step < kSteps; ++step) {
    const Batch b = global_batch(step, replicas);
    opt.zero_grad();
    ref.losses.push_back(loss_value(loss.forward(model->forward(b.x), b.y)));
    Tensor g = loss.backward();
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
  PipelineStage stage(stage_of(grid.stages, grid.stage), grid, options);
  if (x.fp16) stage.module().set_amp(AmpMode::kFp16);
  Sgd opt(stage.module().parameters(), sgd());
  std::optional<StageZero> zero;
  if (x.zero > 0) zero.emplace(stage.module(), grid);
  std::optional<PipelineClipper> clipper;
  if (x.clip > 0.f) clipper.emplace(test_comm(), stage);
  LossScaling scaling(test_comm(), scaler_settings(), Device::cpu());
  const float loss_scale = x.fp16 ? scaling.scale() : 1.f;
  PipelineRun run;
  for (int step = 0; step < kSteps; ++step) {
    const Batch mine = rows_of(global_batch(step, grid.replicas), grid.replica * kRowsPerReplica, kRowsPerReplica);
    opt.zero_grad();
    const int64_t rows = kRowsPerReplica / accumulate;
    float loss = 0;
    for (int a = 0; a < accumulate; ++a) {
      const Batch part = rows_of(mine, a * rows, rows);
      loss += stage.train_step(part.x, part.y, {a, accumulate, x.fp16 ? scaling.scale() : loss_scale}).loss /
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
    ASSERT_EQ(run.norms.size(), ref.norms.size());
    int clipped = 0;
    for (size_t s = 0; s < ref.norms.size(); ++s) {
      EXPECT_NEAR(run.norms[s], ref.norms[s], 1e-5 * ref.norms[s]) << "step " << s;
      clipped += ref.norms[s] > kMaxNorm;
    }
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
  int grids = 0;
  for (int stages : pipeline_grids()) {
    PipelineGrid grid = make_pipeline_grid(test_comm(), stages);
    if (grid.replicas > 1) {
      ++grids;
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
    }
    grid.chain->shutdown();
    grid.data_parallel->shutdown();
  }
  if (grids == 0) GTEST_SKIP() << "no grid with more than one replica at np " << test_comm().size();
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
