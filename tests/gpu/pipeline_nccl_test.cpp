// Note [Pipeline on a GPU] (pipeline/grid.h) under mpirun, one GPU per rank: every P x D grid
// the world allows, its groups' device communicators NCCL (over MPI's groups, as the Runtime
// makes them), trains the MLP on the GPUs: the weights after N steps are the unsplit model's
// on the CPU (1e-4 relative: GPU against CPU rounding), GPipe's are 1F1B's bit for bit (one
// summation order whatever the schedule), and an evaluation's loss is the unsplit model's.
// Skips on every rank, with the reason, when the node has fewer GPUs than local ranks.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "comm/nccl/nccl_communicator.h"
#include "core/cuda/cuda_backend.h"
#include "core/device_select.h"
#include "model/loss.h"
#include "pipeline/grid.h"
#include "pipeline/pipeline_stage.h"
#include "tests/mpi/mpi_test_env.h"
#include "tests/mpi/pipeline_mlp.h"
#include "tests/mpi/pipeline_test_util.h"

namespace dtrain {
namespace {

using testing::pipeline_grids;
using testing::test_comm;
using testing::worst_relative;
using namespace testing::pipeline_mlp;  // NOLINT: the test MLP, its stages and batches

constexpr int kSteps = 10;
using Weights = std::map<std::string, std::vector<float>>;

class PipelineNccl : public ::testing::Test {
 protected:
  void SetUp() override {
    Communicator& world = test_comm();
    // Every rank takes the same branch, or one would wait in ncclCommInitRank forever.
    int32_t ok = cuda::device_count() >= world.local_size() ? 1 : 0;
    world.allreduce(&ok, 1, DType::kI32, ReduceOp::kSum);
    if (ok != world.size())
      GTEST_SKIP() << fmt::format("needs one GPU per local rank ({} local ranks; this rank sees {})",
                                  world.local_size(), cuda::device_count());
    gpu_ = select_device(DeviceRequest::cuda(), world.local_rank(), world.local_size(), false).device;
  }

  // The grid with NCCL device communicators, bootstrapped as Runtime::device_communicator does.
  PipelineGrid nccl_grid(int stages) {
    return make_pipeline_grid(test_comm(), stages, [this](Communicator& group, const std::string&) {
      NcclOptions options;
      options.timeout = std::chrono::seconds(120);
      options.compute = &compute_stream(gpu_);
      return std::make_unique<NcclCommunicator>(group, gpu_, options);
    });
  }

  Device gpu_;
};

Weights weights_of(Module& m) {
  Weights w;
  for (Parameter* p : m.parameters()) w[p->name] = p->value.to_vector();
  return w;
}

struct GpuRun {
  Weights weights;
  double eval_loss_sum = 0;  // the last stage's
};

GpuRun train_on_gpus(PipelineGrid& grid, PipelineSchedule schedule, Device gpu) {
  PipelineOptions options{schedule, 4};
  options.device = gpu;
  PipelineStage stage(stage_of(grid.stages, grid.stage, gpu), grid, options);
  Sgd opt(stage.module().parameters(), sgd());
  for (int step = 0; step < kSteps; ++step) {
    const Batch mine = rows_of(global_batch(step, grid.replicas), grid.replica * kRowsPerReplica, kRowsPerReplica);
    opt.zero_grad();
    stage.train_step(mine.x.to(gpu), mine.y.to(gpu));
    opt.step();
  }
  const Batch test = global_batch(99, 1);
  GpuRun run;
  run.eval_loss_sum = stage.evaluate_batch(test.x.to(gpu), test.y.to(gpu)).loss_sum;
  run.weights = weights_of(stage.module());
  return run;
}

TEST_F(PipelineNccl, EveryGridOnTheGpusEqualsTheUnsplitModelAndGpipeEquals1f1bBitForBit) {
  for (int stages : pipeline_grids()) {
    PipelineGrid grid = nccl_grid(stages);
    SCOPED_TRACE(fmt::format("P {} x D {}, stage {}", stages, grid.replicas, grid.stage));
    ASSERT_EQ(grid.tensor_chain().backend(), "nccl");
    // The unsplit model on the CPU, on the same global batches.
    auto model = make_mlp();
    Sgd opt(model->parameters(), sgd());
    CrossEntropyLoss loss;
    for (int step = 0; step < kSteps; ++step) {
      const Batch b = global_batch(step, grid.replicas);
      opt.zero_grad();
      loss.forward(model->forward(b.x), b.y);
      model->backward(loss.backward(), false);
      opt.step();
    }
    const Batch test = global_batch(99, 1);
    const double want_eval = static_cast<double>(loss_value(loss.forward(model->forward(test.x), test.y))) *
                             static_cast<double>(test.y.numel());
    const GpuRun f1b = train_on_gpus(grid, PipelineSchedule::k1f1b, gpu_);
    const GpuRun gpipe = train_on_gpus(grid, PipelineSchedule::kGpipe, gpu_);
    ASSERT_FALSE(f1b.weights.empty());
    const double worst = worst_relative(f1b.weights, weights_of(*model));
    EXPECT_LT(worst, 1e-4);
    EXPECT_GT(worst_relative(f1b.weights, weights_of(*make_mlp())), 1e-2);  // not vacuous: they moved
    EXPECT_TRUE(f1b.weights == gpipe.weights) << "GPipe and 1F1B must sum the micro-batches in one order";
    if (grid.stage == stages - 1) {
      EXPECT_NEAR(f1b.eval_loss_sum, want_eval, 1e-4 * std::fabs(want_eval));
    }
    if (test_comm().rank() == 0)
      std::printf("GPU P %d x D %d: worst relative difference %.3g\n", stages, grid.replicas, worst);
    shutdown_grid(grid);
  }
}

}  // namespace
}  // namespace dtrain
