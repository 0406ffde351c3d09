// Pipeline parallelism at 2, 3 and 4 ranks (Note [Pipeline schedules], [Pipeline grid],
// [Pipeline loss]): every P x D grid the world allows (P = 2 and 3 alone, 2 x 2 and 4 x 1 at
// np 4) trains an MLP whose weights after N SGD steps equal the unsplit model's trained in one
// process on the same global batch (1e-5 relative), with the same losses; GPipe and 1F1B give
// the same weights bit for bit; fewer micro-batches than stages is refused in one line.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "core/error.h"
#include "model/loss.h"
#include "model/models.h"
#include "model/optimizer.h"
#include "pipeline/partition.h"
#include "pipeline/pipeline_stage.h"
#include "tests/mpi/collective_test_util.h"
#include "tests/mpi/mpi_test_env.h"
#include "tests/mpi/pipeline_test_util.h"

namespace dtrain {
namespace {

using testing::error_of;
using testing::pipeline_grids;
using testing::test_comm;
using testing::worst_relative;

constexpr int64_t kRowsPerReplica = 8;
constexpr int kSteps = 30;
const Shape kSample = {1, 8, 8};

std::unique_ptr<Sequential> make_mlp() {
  ModelSpec spec;
  spec.hidden = {24, 20, 16, 12};
  return build_model(spec, kSample, 10, Device::cpu(), /*seed=*/7);
}

SgdOptions sgd() { return SgdOptions{0.05f, 0.9f, 0.f, 1e-4f, false}; }

struct Batch {
  Tensor x, y;
};

// Step `step`'s global batch (replicas x kRowsPerReplica rows), the same on every rank.
Batch global_batch(int step, int replicas) {
  const int64_t rows = kRowsPerReplica * replicas;
  std::mt19937 gen(1000 + static_cast<uint32_t>(step));
  std::uniform_real_distribution<float> px(0.f, 1.f);
  std::uniform_int_distribution<int> cls(0, 9);
  std::vector<float> x(static_cast<size_t>(rows * 64));
  for (float& v : x) v = px(gen);
  Batch b{Tensor::from_vector(x, {rows, 1, 8, 8}), Tensor::empty({rows}, Device::cpu(), DType::kI32)};
  for (int64_t i = 0; i < rows; ++i) b.y.data_as<int32_t>()[i] = cls(gen);
  return b;
}

Batch rows_of(const Batch& b, int64_t first, int64_t count) {
  return {b.x.slice(first * 64, {count, 1, 8, 8}), b.y.slice(first, {count})};
}

// The unsplit model trained in one process on each step's global batch: name -> values, losses.
struct Reference {
  std::map<std::string, std::vector<float>> weights;
  std::vector<float> losses;
};

Reference train_unsplit(int replicas) {
  auto model = make_mlp();
  Sgd opt(model->parameters(), sgd());
  CrossEntropyLoss loss;
  Reference ref;
  for (int step = 0; step < kSteps; ++step) {
    const Batch b = global_batch(step, replicas);
    opt.zero_grad();
    ref.losses.push_back(loss_value(loss.forward(model->forward(b.x), b.y)));
    model->backward(loss.backward(), false);
    opt.step();
  }
  for (Parameter* p : model->parameters()) ref.weights[p->name] = p->value.to_vector();
  return ref;
}

// This rank's stage of the MLP cut into `stages` (balanced by parameter count).
std::unique_ptr<Sequential> stage_of(int stages, int stage) {
  auto full = make_mlp();
  std::vector<int64_t> counts;
  for (size_t i = 0; i < full->size(); ++i) {
    int64_t n = 0;
    for (Parameter* p : full->layer(i).parameters()) n += p->value.numel();
    counts.push_back(n);
  }
  const StageRange range = balanced_partition(counts, stages)[static_cast<size_t>(stage)];
  auto layers = full->release_layers();
  std::vector<std::unique_ptr<Module>> mine;
  for (size_t i = range.begin; i < range.end; ++i) mine.push_back(std::move(layers[i]));
  return Sequential::of_named_layers(std::move(mine));
}

struct PipelineRun {
  std::map<std::string, std::vector<float>> weights;  // this stage's
  std::vector<float> losses;                          // the last stage's, averaged over replicas
  int peak_held = 0;
};

// `accumulate` pipeline steps per optimizer step, each of this replica's rows / accumulate.
PipelineRun train_pipeline(PipelineGrid& grid, PipelineSchedule schedule, int micro_batches, int accumulate = 1) {
  PipelineStage stage(stage_of(grid.stages, grid.stage), grid, {schedule, micro_batches});
  Sgd opt(stage.module().parameters(), sgd());
  PipelineRun run;
  for (int step = 0; step < kSteps; ++step) {
    const Batch mine = rows_of(global_batch(step, grid.replicas), grid.replica * kRowsPerReplica, kRowsPerReplica);
    opt.zero_grad();
    const int64_t rows = kRowsPerReplica / accumulate;
    float loss = 0;
    for (int a = 0; a < accumulate; ++a) {
      const Batch part = rows_of(mine, a * rows, rows);
      loss += stage.train_step(part.x, part.y, {a, accumulate}).loss / static_cast<float>(accumulate);
    }
    if (grid.stage == grid.stages - 1) grid.data_parallel->allreduce(&loss, 1, DType::kF32, ReduceOp::kAvg);
    run.losses.push_back(loss);
    opt.step();
  }
  for (Parameter* p : stage.module().parameters()) run.weights[p->name] = p->value.to_vector();
  run.peak_held = stage.peak_held_inputs();
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
