// Note [Pipeline on a GPU] (pipeline/grid.h) on one GPU: Runtime::device_communicator makes the
// NCCL communicators of a one-rank grid's two groups (each with a flight recorder of its own,
// named for the group), the device chain carries a batch to itself, and a one-stage
// PipelineStage on the GPU takes the CPU stage's step. Skips, saying why, without a GPU.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "comm/flight_recorder.h"
#include "comm/runtime.h"
#include "comm/self_communicator.h"
#include "core/ops.h"
#include "model/models.h"
#include "pipeline/grid.h"
#include "pipeline/pipeline_stage.h"
#include "tests/gpu/gpu_test.h"

namespace dtrain {
namespace {

using PipelineOneGpu = testing::GpuTest;

std::unique_ptr<Runtime> one_gpu_runtime(const std::string& recorder_dir) {
  static char arg0[] = "dtrain_gpu_tests";
  static char* args[] = {arg0, nullptr};
  int argc = 1;
  char** argv = args;
  RuntimeOptions options;
  options.device = DeviceRequest::cuda(0);
  options.collective_timeout_s = 60;
  options.flight_recorder_dir = recorder_dir;
  return init(&argc, &argv, options);
}

TEST_F(PipelineOneGpu, TheGridsDeviceCommunicatorsAreNcclWithRecordersOfTheirOwn) {
  const std::string dir = ::testing::TempDir();
  std::unique_ptr<Runtime> rt = one_gpu_runtime(dir);
  ASSERT_TRUE(rt->device().is_cuda());
  PipelineGrid grid = make_pipeline_grid(rt->control(), 1, [&](Communicator& group, const std::string& name) {
    return rt->device_communicator(group, name);
  });
  ASSERT_TRUE(grid.device_chain && grid.device_data_parallel);
  EXPECT_EQ(grid.tensor_chain().backend(), "nccl");
  EXPECT_EQ(grid.tensor_group().backend(), "nccl");
  EXPECT_NE(grid.chain->backend(), "nccl");  // the shapes' host chain stays what it was

  // A batch to itself over the device chain (NCCL's grouped send and receive) copies.
  const int n = 4096;
  Tensor from = Tensor::from_vector(std::vector<float>(n, 3.25f), {n}, gpu());
  Tensor to = Tensor::zeros({n}, gpu());
  order_after(compute_stream(gpu()), grid.tensor_chain());
  grid.tensor_chain()
      .batch_p2p_async({{P2pOp::kSend, from.raw(), n, DType::kF32, 0, 0}, {P2pOp::kRecv, to.raw(), n, DType::kF32, 0, 0}})
      ->wait();
  EXPECT_EQ(to.to_vector(), std::vector<float>(n, 3.25f));

  // Each device communicator's recorder is its own file (SIGUSR1's dump: the run goes on).
  const std::string path = FlightRecorder::dump_path(dir, 0, "nccl-pipeline0");
  const std::string group_path = FlightRecorder::dump_path(dir, 0, "nccl-stage0");
  std::remove(path.c_str());
  std::remove(group_path.c_str());
  request_flight_recorder_dump();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!(std::ifstream(path).good() && std::ifstream(group_path).good()) &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  ASSERT_FALSE(text.str().empty()) << "no " << path << " 10 s after the request";
  EXPECT_NE(text.str().find("\"sendrecv\""), std::string::npos) << text.str();
  EXPECT_TRUE(std::ifstream(group_path).good()) << "no " << group_path;
  shutdown_grid(grid);
}

// One stage (P = 1) on the GPU against the same stage on the CPU: the stage's device plumbing
// (its buffers on the device, the tensors' communicators the NCCL ones) takes the CPU's step.
TEST_F(PipelineOneGpu, AOneStagePipelineOnTheGpuTakesTheCpuStagesStep) {
  std::unique_ptr<Runtime> rt = one_gpu_runtime(::testing::TempDir());
  ModelSpec spec;
  spec.hidden = {64, 32};
  const Shape sample = {1, 8, 8};
  const int rows = 16;
  std::vector<float> x(rows * 64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 101) / 101.f;
  Tensor y = Tensor::empty({rows}, Device::cpu(), DType::kI32);
  for (int i = 0; i < rows; ++i) y.data_as<int32_t>()[i] = (i * 7) % 10;
  const Tensor images = Tensor::from_vector(x, {rows, 1, 8, 8});

  SelfCommunicator self;
  PipelineGrid cpu_grid = make_pipeline_grid(self, 1);
  PipelineStage cpu(build_model(spec, sample, 10, Device::cpu(), 7), cpu_grid, {PipelineSchedule::k1f1b, 2});
  const float cpu_loss = cpu.train_step(images, y).loss;

  PipelineGrid grid = make_pipeline_grid(rt->control(), 1, [&](Communicator& group, const std::string& name) {
    return rt->device_communicator(group, name);
  });
  PipelineOptions options{PipelineSchedule::k1f1b, 2};
  options.device = gpu();
  PipelineStage dev(build_model(spec, sample, 10, gpu(), 7), grid, options);
  const float gpu_loss = dev.train_step(images.to(gpu()), y.to(gpu())).loss;
  EXPECT_NEAR(gpu_loss, cpu_loss, 1e-5 * std::abs(cpu_loss));
  const std::vector<Parameter*> a = cpu.module().parameters(), b = dev.module().parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_LT(testing::max_rel_diff(a[i]->grad, b[i]->grad), 1e-5) << a[i]->name;
  const double cpu_eval = cpu.evaluate_batch(images, y).loss_sum;
  const double gpu_eval = dev.evaluate_batch(images.to(gpu()), y.to(gpu())).loss_sum;
  EXPECT_NEAR(gpu_eval, cpu_eval, 1e-5 * std::abs(cpu_eval));
  shutdown_grid(grid);
  shutdown_grid(cpu_grid);
}

}  // namespace
}  // namespace dtrain
