// A stand-in for libdtrain_nccl.so (tests/unit/comm/gpu_plugins_test.cpp): the same entry point and
// API version, built like the real plugin without dtrain_comm. Its one-rank communicator records
// each collective in NcclOptions::log and answers dump requests (SIGUSR1) as the real watchdog
// does (comm/dump_on_request.h), on a thread that polls comm's counter through
// NcclOptions::dump_requests every millisecond. It reduces nothing: a CPU build tests what
// crosses the entry point, not NCCL.
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "comm/collective_log.h"
#include "comm/dump_on_request.h"
#include "comm/nccl/nccl_plugin.h"

namespace {

using namespace dtrain;

class DoneWork final : public Work {
 public:
  explicit DoneWork(bool device_timed) : device_timed_(device_timed) {}
  void wait() override {}
  bool test() override { return true; }
  bool device_timed() const override { return device_timed_; }

 private:
  bool device_timed_;
};

class FakeNccl final : public Communicator {
 public:
  FakeNccl(int rank, const NcclOptions& options)
      : rank_(rank), log_(options.log), device_timing_(options.device_timing),
        usr1_(rank, "nccl", options.dump_requests, options.dump_log) {
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        usr1_.poll();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
  }
  ~FakeNccl() override {
    stop_.store(true);
    thread_.join();
  }

  int rank() const override { return rank_; }
  int size() const override { return 1; }
  int local_rank() const override { return rank_; }
  int local_size() const override { return 1; }
  std::string backend() const override { return "nccl"; }
  Stream& stream() override { throw std::logic_error("the fake NCCL plugin has no stream"); }
  WorkHandle allreduce_async(void*, int64_t count, DType dtype, ReduceOp) override {
    return run("allreduce", dtype, count);
  }
  WorkHandle broadcast_async(void*, int64_t count, DType dtype, int) override { return run("broadcast", dtype, count); }
  WorkHandle allgather_async(const void*, void*, int64_t count, DType dtype) override {
    return run("allgather", dtype, count);
  }
  WorkHandle barrier_async() override { return run("barrier", DType::kF32, 1); }

 private:
  WorkHandle run(const char* op, DType dtype, int64_t count) {
    const LoggedCollective record(log_, op, dtype, count);
    record.started();
    record.finished(true);
    return std::make_shared<DoneWork>(device_timing_);
  }

  int rank_;
  CollectiveLog* log_;
  bool device_timing_;
  DumpOnRequest usr1_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

Communicator* make_fake_nccl(Communicator& bootstrap, Device, const NcclOptions& options) {
  return new FakeNccl(bootstrap.rank(), options);
}

}  // namespace

extern "C" const dtrain::NcclPlugin* dtrain_nccl_plugin_init() {
  static const dtrain::NcclPlugin plugin{dtrain::kNcclPluginApiVersion, &make_fake_nccl};
  return &plugin;
}
