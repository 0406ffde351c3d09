// Every comm hook orders its all-reduce after the stream that produced the bucket (Note
// [Ordering a collective after its producer] in comm/communicator.h): on a GPU a missing wait
// lets NCCL read a gradient, or a 16-bit wire buffer, before the kernel writing it has run. On
// CPU, recording streams and a logging communicator show the order each hook asks for: an
// event recorded on the producer stream the hook was given, the communication stream waiting
// on it, then the all-reduce, with the 16-bit pack already queued before the event.
#include <cstring>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/kernels.h"
#include "ddp/comm_hook.h"
#include "recording_stream.h"

namespace dtrain {
namespace {

std::vector<std::string>& g_log = testing::ordering_log();
using testing::LoggedEvent;
using testing::RecordingStream;

struct DoneWork : Work {
  void wait() override {}
  bool test() override { return true; }
};

// One rank; logs each all-reduce with its dtype and the first element it would send, so a
// pack queued after the all-reduce shows as the wrong value.
struct LoggingCommunicator : Communicator {
  RecordingStream comm_stream{"comm"};
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string backend() const override { return "log"; }
  Stream& stream() override { return comm_stream; }
  WorkHandle allreduce_async(void* buf, int64_t count, DType dtype, ReduceOp) override {
    float first = 0;
    if (dtype == DType::kF32) std::memcpy(&first, buf, sizeof first);
    if (dtype == DType::kBF16) first = kernels::bf16_to_float(*static_cast<const uint16_t*>(buf));
    if (dtype == DType::kF16) first = kernels::fp16_to_float(*static_cast<const uint16_t*>(buf));
    g_log.push_back(fmt::format("allreduce {} x{} first={}", dtype_name(dtype), count, first));
    return std::make_shared<DoneWork>();
  }
  WorkHandle broadcast_async(void*, int64_t, DType, int) override { return std::make_shared<DoneWork>(); }
  WorkHandle allgather_async(const void*, void*, int64_t, DType) override { return std::make_shared<DoneWork>(); }
  WorkHandle barrier_async() override { return std::make_shared<DoneWork>(); }
};

class CommHookOrdering : public ::testing::TestWithParam<CommHookKind> {};

TEST_P(CommHookOrdering, AllreduceWaitsOnAnEventOfTheProducerStreamRecordedAfterThePack) {
  const CommHookKind kind = GetParam();
  std::unique_ptr<CommHook> hook = make_comm_hook(kind);
  GradBucket bucket;
  bucket.index = 0;
  bucket.buffer = Tensor::from_vector(std::vector<float>(6, 0.75f), {6});
  LoggingCommunicator comm;
  RecordingStream compute("compute");
  g_log.clear();
  WorkHandle work = hook->run(bucket, comm, compute);
  work->wait();
  const char* dtype = kind == CommHookKind::kBf16 ? "bfloat16" : kind == CommHookKind::kFp16 ? "float16" : "float32";
  // Recorded on the stream the hook was handed (not a global one), after the pack (first=0.75).
  const std::vector<std::string> want = {"compute.record(0)", "comm.wait(0)",
                                         fmt::format("allreduce {} x6 first=0.75", dtype)};
  EXPECT_EQ(g_log, want) << comm_hook_name(kind);
  EXPECT_EQ(bucket.buffer.to_vector(), std::vector<float>(6, 0.75f)) << "one rank: the average is the value";
}

INSTANTIATE_TEST_SUITE_P(EveryHook, CommHookOrdering,
                         ::testing::Values(CommHookKind::kAllreduce, CommHookKind::kBf16, CommHookKind::kFp16),
                         [](const auto& info) { return std::string(comm_hook_name(info.param)); });

}  // namespace
}  // namespace dtrain
