// The reducer's stream ordering (Note [Stream ordering]) and launch order (Note [Launch order]),
// checked on CPU with recording streams and a communicator that logs what it is asked to do.
// The same reducer code drives CUDA streams on GPU.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "ddp/reducer.h"
#include "model/loss.h"
#include "model/models.h"
#include "recording_stream.h"

namespace dtrain {
namespace {

std::vector<std::string>& g_log = testing::ordering_log();
using testing::LoggedEvent;
using testing::RecordingStream;

struct LoggedWork : Work {
  int bucket;
  explicit LoggedWork(int b) : bucket(b) {}
  void wait() override { g_log.push_back(fmt::format("wait(allreduce {})", bucket)); }
  bool test() override { return true; }
};

// Size 1, so an average is the identity; logs each collective.
struct LoggingCommunicator : Communicator {
  RecordingStream comm_stream{"comm"};
  int launched = 0;
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string backend() const override { return "log"; }
  Stream& stream() override { return comm_stream; }
  WorkHandle allreduce_async(void*, int64_t count, DType, ReduceOp) override {
    g_log.push_back(fmt::format("allreduce {} ({} floats)", launched, count));
    return std::make_shared<LoggedWork>(launched++);
  }
  WorkHandle broadcast_async(void*, int64_t, DType, int) override { return std::make_shared<LoggedWork>(-1); }
  WorkHandle allgather_async(const void*, void*, int64_t, DType) override { return std::make_shared<LoggedWork>(-1); }
  WorkHandle barrier_async() override { return std::make_shared<LoggedWork>(-1); }
};

TEST(ReducerOrdering, ComputeEventThenCommWaitThenAllreduceAndWaitsInBucketOrder) {
  auto model = build_model(ModelSpec{ModelKind::kMlp, {64, 32}}, {1, 28, 28}, 10, Device::cpu(), 1);
  LoggingCommunicator comm;
  RecordingStream compute("compute");
  // Small caps: several buckets. Param bytes (reverse): 40, 1280, 128, 8192, 256, 200704.
  ReducerOptions options{1024, 4096, false};
  Reducer reducer(model->parameters(), comm, make_allreduce_hook(), options, compute);
  ASSERT_EQ(reducer.buckets().size(), 3u);
  model->set_grad_ready_hook([&](Parameter& p) {
    g_log.push_back("ready " + p.name);
    reducer.mark_ready(p);
  });

  std::vector<float> pixels(2 * 784, 0.5f);
  Tensor labels = Tensor::zeros({2}, Device::cpu(), DType::kI32);
  CrossEntropyLoss loss;
  loss.forward(model->forward(Tensor::from_vector(pixels, {2, 1, 28, 28})), labels);
  g_log.clear();
  reducer.prepare_for_backward(true);
  model->backward(loss.backward(), false);
  g_log.push_back("backward returned");
  reducer.finalize_backward();

  const std::vector<std::string> want = {
      "ready 5.bias", "ready 5.weight",                                  // bucket 0: 1320 B >= 1 KiB
      "compute.record(0)", "comm.wait(0)", "allreduce 0 (330 floats)",   //   launched inside backward
      "ready 3.bias", "ready 3.weight",                                   // bucket 1: 8320 B >= 4 KiB
      "compute.record(1)", "comm.wait(1)", "allreduce 1 (2080 floats)",
      "ready 1.bias", "ready 1.weight",                                   // bucket 2: the rest
      "compute.record(2)", "comm.wait(2)", "allreduce 2 (50240 floats)",
      "backward returned",
      "wait(allreduce 0)", "wait(allreduce 1)", "wait(allreduce 2)"};
  EXPECT_EQ(g_log, want);
  EXPECT_EQ(reducer.stats().buckets_launched_during_backward, 3);
  EXPECT_EQ(reducer.stats().buckets_launched_in_finalize, 0);
}

TEST(ReducerOrdering, GradientsAreViewsIntoBucketsAndKeepTheirValues) {
  auto model = build_model(ModelSpec{ModelKind::kMlp, {8}}, {1, 2, 2}, 3, Device::cpu(), 1);
  auto params = model->parameters();
  params[0]->grad.copy_from(Tensor::from_vector(std::vector<float>(32, 1.5f), {8, 4}));
  LoggingCommunicator comm;
  Reducer reducer(params, comm, make_allreduce_hook(), ReducerOptions{}, compute_stream(Device::cpu()));
  ASSERT_EQ(reducer.buckets().size(), 1u);
  const GradBucket& b = reducer.buckets()[0];
  for (size_t k = 0; k < b.params.size(); ++k) EXPECT_TRUE(params[b.params[k]]->grad.shares_storage(b.buffer));
  EXPECT_EQ(params[0]->grad.to_vector(), std::vector<float>(32, 1.5f));
}

}  // namespace
}  // namespace dtrain
