// DistributedDataParallel on one GPU over a one-rank NCCL communicator, bit for bit against the
// same DDP on CPU (a one-rank SelfCommunicator): the plain all-reduce, the bf16 and fp16 hooks,
// the bucket rebuild, the bucket-cap autotuner, unused parameters, no_sync and Join's shadow
// backward. Until these ran, DDP had never executed on a GPU (a one-rank run builds no DDP).
//
// Bit for bit on two devices: parameters, inputs and output gradients are small integers, so
// every GEMM of the MLP is exact in float32 (and in TF32) whatever its summation order, and both
// devices run the same pack/unpack functors (core/kernels.h).
//
// The NCCL communicator is made the way the Runtime makes it: through its plugin (Note [GPU
// plugins without a cycle] in core/gpu_backend.h), given the compute stream (NcclOptions::compute)
// and a flight recorder. It waits for no stream by itself: DDP's comm hooks order each bucket's
// all-reduce after its producer (allreduce_after, Note [Ordering a collective after its producer]
// in comm/communicator.h), and so do the tests below that issue all-reduces themselves.
//
// Stream ordering: a one-rank all-reduce leaves its buffer as it was, so a missing stream wait
// would go unnoticed. LateDoubling wraps the NCCL communicator: after each all-reduce it spins
// ~20 ms on the communication stream and then doubles the buffer there (as a second rank with
// equal gradients would). The expected gradients are then exactly twice the CPU's; a reader that
// did not wait for the communication stream (the unpack of a 16-bit hook, the gradients read
// after backward) sees undoubled values, and an all-reduce that did not wait for the compute
// stream doubles gradients that backward then overwrites (the compute stream is delayed too).
// The wrapper's stream() is the NCCL communicator's: allreduce_after orders that stream, and the
// doubling is queued on it after the all-reduce.
#include <cctype>
#include <chrono>
#include <cstdint>
#include <ostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "comm/flight_recorder.h"
#include "comm/gpu_plugins.h"
#include "comm/nccl/nccl_plugin.h"
#include "comm/self_communicator.h"
#include "core/gpu_backend.h"
#include "core/stream.h"
#include "ddp/distributed_data_parallel.h"
#include "model/linear.h"
#include "model/models.h"
#include "tests/gpu/gpu_test.h"
#include "tests/gpu/stream_kernels.h"

namespace dtrain {
namespace {

// ~20 ms on current GPUs (1-2 GHz): long enough for an unordered reader to run first.
constexpr int64_t kSpinCycles = 40'000'000;

// A one-rank NCCL communicator over `bootstrap`, through the plugin as the Runtime makes it
// (comm/runtime.cpp): its Work::wait() orders `compute`; its collectives go to `log` (may be null);
// `device_timing`: NcclOptions::device_timing (--trace, --metrics).
std::unique_ptr<Communicator> make_nccl(Communicator& bootstrap, Device device, Stream& compute, CollectiveLog* log,
                                        bool device_timing = false) {
  const auto* plugin = static_cast<const NcclPlugin*>(
      open_plugin(gpu_plugin_path(kNcclPluginLibrary), kNcclPluginEntryPoint, kNcclPluginApiVersion));
  NcclOptions options;
  options.timeout = std::chrono::seconds(60);
  options.compute = &compute;
  options.log = log;
  options.device_timing = device_timing;
  return std::unique_ptr<Communicator>(plugin->make_communicator(bootstrap, device, options));
}

// A Work complete once `done` (recorded on the communication stream after the doubling) is.
class LateWork final : public Work {
 public:
  LateWork(WorkHandle inner, std::shared_ptr<Event> done, Stream& compute)
      : inner_(std::move(inner)), done_(std::move(done)), compute_(compute) {}
  void wait() override {
    inner_->wait();
    compute_.wait(*done_);
  }
  bool test() override { return inner_->test() && done_->query(); }
  int64_t started_ns() const override { return inner_->started_ns(); }
  int64_t finished_ns() const override { return inner_->finished_ns(); }

 private:
  WorkHandle inner_;
  std::shared_ptr<Event> done_;
  Stream& compute_;
};

// The NCCL communicator with late, doubling all-reduces (see the top of this file).
class LateDoubling final : public Communicator {
 public:
  LateDoubling(Communicator& inner, Stream& compute) : inner_(inner), compute_(compute) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  int local_rank() const override { return inner_.local_rank(); }
  int local_size() const override { return inner_.local_size(); }
  std::string backend() const override { return inner_.backend(); }
  Stream& stream() override { return inner_.stream(); }
  WorkHandle allreduce_async(void* buf, int64_t count, DType dtype, ReduceOp op) override {
    WorkHandle work = inner_.allreduce_async(buf, count, dtype, op);
    const testing::Values values = dtype == DType::kBF16  ? testing::Values::kBF16
                                   : dtype == DType::kF16 ? testing::Values::kF16
                                                          : testing::Values::kF32;
    EXPECT_TRUE(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16) << dtype_name(dtype);
    testing::spin_then_double(inner_.stream().native(), buf, count, values, kSpinCycles);
    return std::make_shared<LateWork>(std::move(work), inner_.stream().record(), compute_);
  }
  WorkHandle broadcast_async(void* buf, int64_t count, DType dtype, int root) override {
    return inner_.broadcast_async(buf, count, dtype, root);
  }
  WorkHandle allgather_async(const void* send, void* recv, int64_t count_per_rank, DType dtype) override {
    return inner_.allgather_async(send, recv, count_per_rank, dtype);
  }
  WorkHandle barrier_async() override { return inner_.barrier_async(); }

 private:
  Communicator& inner_;
  Stream& compute_;
};

// Small integers in [-2, 2]: products and sums stay exact (see the top of this file).
std::vector<float> small_integers(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> v(-2, 2);
  std::vector<float> out(n);
  for (float& x : out) x = static_cast<float>(v(gen));
  return out;
}

Tensor integer_tensor(const Shape& shape, uint32_t seed, Device device) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return Tensor::from_vector(small_integers(static_cast<size_t>(n), seed), shape).to(device);
}

void set_integer_parameters(Module& m) {
  uint32_t seed = 1000;
  for (Parameter* p : m.parameters()) p->value.copy_from(integer_tensor(p->value.shape(), seed++, p->value.device()));
}

void clear_grads(Module& m) {
  for (Parameter* p : m.parameters()) {
    p->grad.zero_();
    p->grad_is_zero = false;
  }
}

std::vector<float> flat_grads(Module& m) {
  std::vector<float> out;
  for (Parameter* p : m.parameters()) {
    const std::vector<float> g = p->grad.to_vector();
    out.insert(out.end(), g.begin(), g.end());
  }
  return out;
}

// Exactly equal, no tolerance: bit for bit but for the sign of zero (cuBLAS and OpenBLAS may
// start a sum of (-2 * 0) terms from -0 or +0; that is summation, not DDP).
void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_TRUE(got[i] == want[i]) << what << ": element " << i << " is " << got[i] << ", expected " << want[i];
}

std::vector<float> doubled(std::vector<float> v) {
  for (float& x : v) x *= 2.f;  // exact
  return v;
}

// A Linear whose output the loss uses, then a parameter forward never touches.
class WithUnusedParameter final : public Module {
 public:
  explicit WithUnusedParameter(Device device) : linear_(64, 10, device, rng_) {
    unused_ = {"unused", Tensor::zeros({5}, device), Tensor::zeros({5}, device)};
  }
  Tensor forward(const Tensor& x) override { return linear_.forward(x.view({x.dim(0), 64})); }
  Tensor backward(const Tensor& g, bool need) override { return linear_.backward(g, need); }
  std::vector<Parameter*> parameters() override {
    std::vector<Parameter*> p = linear_.parameters();
    p.push_back(&unused_);
    return p;
  }
  void set_grad_ready_hook(GradReadyHook hook) override { linear_.set_grad_ready_hook(std::move(hook)); }
  std::string describe() const override { return "WithUnusedParameter"; }

 private:
  InitRng rng_{1};
  Linear linear_;
  Parameter unused_;
};

// What a scenario does to one DDP per step; the same on both devices.
struct Scenario {
  std::string name;
  DdpOptions options;
  bool unused_parameter = false;
  int steps = 3;
  int micro_batches = 1;  // > 1: all but the last under no_sync
  bool join_last_step = false;  // the last step is Join's shadow backward
};

// One DDP on `device`, one rank: the gradients after each step, concatenated.
std::vector<float> run(const Scenario& s, Device device, bool late) {
  SelfCommunicator control;
  Stream& compute = compute_stream(device);
  FlightRecorder log(64, "nccl");  // as the Runtime's; outlives the communicator
  std::unique_ptr<Communicator> nccl;
  std::unique_ptr<LateDoubling> late_nccl;
  Communicator* gradients = &control;
  if (device.is_cuda()) {
    nccl = make_nccl(control, device, compute, &log);
    gradients = nccl.get();
    if (late) {
      late_nccl = std::make_unique<LateDoubling>(*nccl, compute);
      gradients = late_nccl.get();
    }
  }
  std::unique_ptr<Module> model;
  if (s.unused_parameter)
    model = std::make_unique<WithUnusedParameter>(device);
  else
    model = build_model(ModelSpec{ModelKind::kMlp, {16}}, {1, 8, 8}, 10, device, 7);
  set_integer_parameters(*model);
  DistributedDataParallel ddp(*model, *gradients, control, compute, s.options);
  std::vector<float> out;
  const int64_t batch = 4;
  for (int step = 0; step < s.steps; ++step) {
    clear_grads(*model);
    if (s.join_last_step && step == s.steps - 1) {
      ddp.join_backward();
    } else {
      for (int k = 0; k < s.micro_batches; ++k) {
        const uint32_t seed = static_cast<uint32_t>(100 * step + k);
        Tensor x = integer_tensor({batch, 1, 8, 8}, seed, device);
        Tensor grad_out = integer_tensor({batch, 10}, seed + 50, device);
        (void)ddp.forward(x);
        // A late compute stream: the all-reduces must wait for the gradients backward queues.
        if (device.is_cuda() && late) testing::spin(compute.native(), kSpinCycles);
        if (k + 1 < s.micro_batches) {
          auto guard = ddp.no_sync();
          ddp.backward(grad_out);
        } else {
          ddp.backward(grad_out);
        }
      }
    }
    const std::vector<float> g = flat_grads(*model);  // after the compute stream's reads
    out.insert(out.end(), g.begin(), g.end());
  }
  compute.synchronize();
  return out;
}

void PrintTo(const Scenario& s, std::ostream* os) { *os << s.name; }

class GpuDdp : public testing::GpuTest, public ::testing::WithParamInterface<Scenario> {};

TEST_P(GpuDdp, OneRankNcclMatchesCpuBitForBit) {
  const Scenario& s = GetParam();
  const std::vector<float> cpu = run(s, Device::cpu(), false);
  expect_bitwise(run(s, gpu(), false), cpu, s.name + " on NCCL");
}

TEST_P(GpuDdp, EveryReaderWaitsForALateCommunicationStream) {
  const Scenario& s = GetParam();
  const std::vector<float> cpu = run(s, Device::cpu(), false);
  expect_bitwise(run(s, gpu(), true), doubled(cpu), s.name + " with late, doubling all-reduces");
}

// Note [Device-timed collectives]: an all-reduce ordered after ~20 ms of compute (allreduce_after)
// starts on the device ~20 ms after the host issued it; host times would say it started at once.
using GpuNcclTiming = testing::GpuTest;

TEST_F(GpuNcclTiming, AllreduceTimesAreTheDevicesNotTheHosts) {
  SelfCommunicator control;
  Stream& compute = compute_stream(gpu());
  std::unique_ptr<Communicator> nccl = make_nccl(control, gpu(), compute, nullptr, /*device_timing=*/true);
  Tensor buf = Tensor::zeros({1 << 20}, gpu());
  // NCCL connects on its first collective: not timed here.
  allreduce_after(compute, *nccl, buf.raw(), buf.numel(), DType::kF32, ReduceOp::kSum)->wait();
  compute.synchronize();
  testing::spin(compute.native(), kSpinCycles);
  const int64_t issued = steady_now_ns();
  WorkHandle work = allreduce_after(compute, *nccl, buf.raw(), buf.numel(), DType::kF32, ReduceOp::kSum);
  ASSERT_TRUE(work->device_timed());
  work->wait();
  work->wait_for_device_times();
  const int64_t done = steady_now_ns();
  EXPECT_GE(work->started_ns() - issued, 5'000'000) << "the span starts when the host issued it, not when it ran";
  EXPECT_LE(work->started_ns(), work->finished_ns());
  EXPECT_LE(work->finished_ns(), done + 1'000'000);  // the anchor is good to microseconds
  compute.synchronize();
}

// Without NcclOptions::device_timing a collective gets no timing events: its Work is not device-timed,
// and DDP, even when asked, keeps the host's times.
TEST_F(GpuNcclTiming, AnUntimedCommunicatorGivesWorkWithoutDeviceTimes) {
  SelfCommunicator control;
  Stream& compute = compute_stream(gpu());
  std::unique_ptr<Communicator> nccl = make_nccl(control, gpu(), compute, nullptr);
  Tensor buf = Tensor::zeros({1024}, gpu());
  WorkHandle work = allreduce_after(compute, *nccl, buf.raw(), buf.numel(), DType::kF32, ReduceOp::kSum);
  EXPECT_FALSE(work->device_timed());
  work->wait();
  std::unique_ptr<Module> model = build_model(ModelSpec{ModelKind::kMlp, {16}}, {1, 8, 8}, 10, gpu(), 7);
  DdpOptions options;
  options.device_timing = true;
  DistributedDataParallel ddp(*model, *nccl, control, compute, options);
  (void)ddp.forward(integer_tensor({4, 1, 8, 8}, 1, gpu()));
  ddp.backward(integer_tensor({4, 10}, 2, gpu()));
  for (const BucketTiming& b : ddp.last_backward().buckets) EXPECT_EQ(b.device_work, nullptr) << "bucket " << b.bucket;
  compute.synchronize();
}

// DDP hands the device's times to traces and metrics when asked to.
TEST_F(GpuNcclTiming, DdpReportsDeviceTimedBucketSpans) {
  SelfCommunicator control;
  Stream& compute = compute_stream(gpu());
  std::unique_ptr<Communicator> nccl = make_nccl(control, gpu(), compute, nullptr, /*device_timing=*/true);
  std::unique_ptr<Module> model = build_model(ModelSpec{ModelKind::kMlp, {16}}, {1, 8, 8}, 10, gpu(), 7);
  DdpOptions options;
  options.device_timing = true;
  DistributedDataParallel ddp(*model, *nccl, control, compute, options);
  (void)ddp.forward(integer_tensor({4, 1, 8, 8}, 1, gpu()));
  // Made before the spin: its upload is a synchronous copy that would wait the spin out on the
  // host, so backward would start late and its all-reduces would look early.
  const Tensor grad_output = integer_tensor({4, 10}, 2, gpu());
  testing::spin(compute.native(), kSpinCycles);  // backward's kernels, and so the all-reduces, run late
  ddp.backward(grad_output);
  const BackwardTiming& t = ddp.last_backward();
  ASSERT_FALSE(t.buckets.empty());
  for (const BucketTiming& b : t.buckets) {
    EXPECT_EQ(b.device_work, nullptr);
    EXPECT_GE(b.started_ns - t.start_ns, 5'000'000)
        << "bucket " << b.bucket << ": launched at +" << b.launched_ns - t.start_ns << " ns, started +"
        << b.started_ns - t.start_ns << ", finished +" << b.finished_ns - t.start_ns << ", backward ended +"
        << t.end_ns - t.start_ns << ", synced +" << t.synced_ns - t.start_ns;
    EXPECT_LE(b.started_ns, b.finished_ns) << "bucket " << b.bucket;
  }
  compute.synchronize();
}

Scenario scenario(std::string name, auto&& adjust) {
  Scenario s;
  s.name = std::move(name);
  s.options.rebuild_buckets = false;
  // Small buckets: several all-reduces per backward, launched from the gradient hooks.
  s.options.bucket_cap_bytes = 2048;
  s.options.first_bucket_bytes = 1024;
  adjust(s);
  return s;
}

std::vector<Scenario> scenarios() {
  return {
      scenario("allreduce", [](Scenario&) {}),
      scenario("bf16 hook", [](Scenario& s) { s.options.comm_hook = CommHookKind::kBf16; }),
      scenario("fp16 hook", [](Scenario& s) { s.options.comm_hook = CommHookKind::kFp16; }),
      scenario("bucket rebuild", [](Scenario& s) { s.options.rebuild_buckets = true; }),
      scenario("bucket cap auto",
               [](Scenario& s) {
                 s.options.bucket_cap_auto = true;
                 s.options.autotune_warmup_steps = 1;
                 s.options.autotune_measured_steps = 1;
                 s.steps = static_cast<int>(s.options.autotune_candidates.size()) * 2 + 3;
               }),
      scenario("unused parameters",
               [](Scenario& s) {
                 s.unused_parameter = true;
                 s.options.find_unused_parameters = true;
               }),
      scenario("no_sync", [](Scenario& s) { s.micro_batches = 3; }),
      scenario("join", [](Scenario& s) { s.join_last_step = true; }),
  };
}

INSTANTIATE_TEST_SUITE_P(Scenarios, GpuDdp, ::testing::ValuesIn(scenarios()),
                         [](const ::testing::TestParamInfo<Scenario>& info) {
                           std::string name;
                           for (char c : info.param.name) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return name;
                         });

}  // namespace
}  // namespace dtrain
