// Streams and events: an event recorded on one stream orders another stream's later work
// after it without the host waiting; the compute stream is per device and follows the
// process's pinned device into other threads.
#include <memory>
#include <thread>

#include <gtest/gtest.h>

#include "core/memory.h"
#include "core/stream.h"
#include "tests/gpu/gpu_test.h"
#include "tests/gpu/stream_kernels.h"

namespace dtrain {
namespace {

using GpuStream = testing::GpuTest;

// ~20 ms on any current GPU (clocks 1-2 GHz): long enough that an unordered reader would
// run first, short enough for a test. The assertion does not depend on the duration.
constexpr int64_t kSpinCycles = 40'000'000;

TEST_F(GpuStream, WaitOrdersAnotherStreamAfterTheEvent) {
  int* flag = static_cast<int*>(device_alloc(gpu(), sizeof(int)));
  int* seen = static_cast<int*>(device_alloc(gpu(), sizeof(int)));
  zero_bytes(flag, gpu(), sizeof(int));
  zero_bytes(seen, gpu(), sizeof(int));
  Stream& compute = compute_stream(gpu());
  std::unique_ptr<Stream> side = make_stream(gpu());

  testing::spin_then_store(compute.native(), flag, 42, kSpinCycles);
  std::shared_ptr<Event> stored = compute.record();
  side->wait(*stored);  // no host wait here
  testing::copy_int(side->native(), seen, flag);
  side->synchronize();

  EXPECT_TRUE(stored->query());  // side finished, and it waited for the event
  int host = 0;
  copy_bytes(&host, Device::cpu(), seen, gpu(), sizeof(int));
  EXPECT_EQ(host, 42);
  device_free(gpu(), flag, sizeof(int));
  device_free(gpu(), seen, sizeof(int));
}

TEST_F(GpuStream, EventSynchronizeWaitsForTheRecordedWork) {
  int* flag = static_cast<int*>(device_alloc(gpu(), sizeof(int)));
  zero_bytes(flag, gpu(), sizeof(int));
  std::unique_ptr<Stream> side = make_stream(gpu());
  testing::spin_then_store(side->native(), flag, 7, kSpinCycles);
  std::shared_ptr<Event> done = side->record();
  done->synchronize();
  EXPECT_TRUE(done->query());
  int host = 0;
  copy_bytes(&host, Device::cpu(), flag, gpu(), sizeof(int));  // on the compute stream
  EXPECT_EQ(host, 7);
  device_free(gpu(), flag, sizeof(int));
}

TEST_F(GpuStream, StreamsAreDistinctNonNullHandlesOnTheirDevice) {
  Stream& compute = compute_stream(gpu());
  EXPECT_EQ(&compute, &compute_stream(gpu()));  // one per device
  std::unique_ptr<Stream> a = make_stream(gpu()), b = make_stream(gpu());
  EXPECT_NE(compute.native(), nullptr);
  EXPECT_NE(a->native(), nullptr);
  EXPECT_NE(a->native(), b->native());
  EXPECT_NE(a->native(), compute.native());
  EXPECT_EQ(a->device(), gpu());
  // A CPU event is complete when recorded: waiting on it is allowed and changes nothing.
  std::shared_ptr<Event> cpu_event = compute_stream(Device::cpu()).record();
  a->wait(*cpu_event);
  a->synchronize();
}

TEST_F(GpuStream, OtherThreadsUseThePinnedDevice) {
  // A fresh thread starts on device 0, so with one GPU this could not tell pinned from default.
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices to tell the pinned one from device 0, found 1";
  const int last = cuda::device_count() - 1;
  cuda::set_device(last);
  int seen_device = -1;
  Device stream_device;
  std::thread([&] {
    // A fresh thread starts on CUDA device 0; dtrain calls move it to the pinned device.
    seen_device = cuda::current_device();
    stream_device = compute_stream(Device::cuda(last)).device();
  }).join();
  EXPECT_EQ(seen_device, last);
  EXPECT_EQ(stream_device, Device::cuda(last));
  cuda::set_device(0);
}

}  // namespace
}  // namespace dtrain
