// The CUDA caching allocator: its policy with a fake device (size classes, reuse, the
// out-of-memory retry, misuse), which needs no GPU, and the real one on a GPU.
#include <map>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "core/cuda/caching_allocator.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/tensor.h"
#include "tests/gpu/gpu_test.h"

namespace dtrain {
namespace {

using cuda::CachingAllocator;
using testing::GpuTest;

// A device with a fixed capacity; records what reached it.
class FakeDevice final : public CachingAllocator::Backend {
 public:
  struct State {
    size_t capacity = 0, used = 0;
    int allocations = 0, releases = 0;
    std::map<void*, size_t> live;
  };
  explicit FakeDevice(std::shared_ptr<State> state) : state_(std::move(state)) {}
  void* allocate(size_t bytes, int) override {
    if (state_->used + bytes > state_->capacity) return nullptr;
    void* p = ::operator new(bytes);
    state_->used += bytes;
    state_->live[p] = bytes;
    ++state_->allocations;
    return p;
  }
  void release(void* ptr, int) override {
    state_->used -= state_->live.at(ptr);
    state_->live.erase(ptr);
    ::operator delete(ptr);
    ++state_->releases;
  }

 private:
  std::shared_ptr<State> state_;
};

std::shared_ptr<FakeDevice::State> fake_state(size_t capacity) {
  auto state = std::make_shared<FakeDevice::State>();
  state->capacity = capacity;
  return state;
}

struct Fixture {
  std::shared_ptr<FakeDevice::State> device;
  CachingAllocator allocator;
  explicit Fixture(size_t capacity) : device(fake_state(capacity)), allocator(std::make_unique<FakeDevice>(device)) {}
};

TEST(CachingAllocatorPolicy, SizeClassesBoundTheSlack) {
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(512), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 640u);
  EXPECT_EQ(CachingAllocator::round_size(1000), 1024u);
  EXPECT_EQ(CachingAllocator::round_size(1025), 1280u);
  EXPECT_EQ(CachingAllocator::round_size(3u << 20), 3u << 20);
  EXPECT_EQ(CachingAllocator::round_size((64u << 20) + 1), 66u << 20);  // large: 2 MiB steps
  for (size_t bytes = 1; bytes < (size_t{1} << 28); bytes = bytes * 3 / 2 + 1) {
    const size_t r = CachingAllocator::round_size(bytes);
    EXPECT_GE(r, bytes);
    EXPECT_LE(r, std::max<size_t>(512, bytes + bytes / 4)) << bytes;
    EXPECT_EQ(r % 128, 0u) << bytes;
  }
}

TEST(CachingAllocatorPolicy, FreedBlocksServeTheSameSizeClassWithoutTheDevice) {
  Fixture f(1 << 20);
  void* a = f.allocator.alloc(1000, 0);
  f.allocator.free(a, 1000, 0);
  void* b = f.allocator.alloc(1010, 0);  // same class (1024): the cached block comes back
  EXPECT_EQ(a, b);
  EXPECT_EQ(f.device->allocations, 1);
  void* c = f.allocator.alloc(2000, 0);  // another class: a new device allocation
  EXPECT_NE(c, b);
  EXPECT_EQ(f.device->allocations, 2);
  cuda::AllocatorStats s = f.allocator.stats(0);
  EXPECT_EQ(s.in_use_bytes, 1024u + 2048u);
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.device_mallocs, 2);
  EXPECT_EQ(s.cache_hits, 1);
  f.allocator.free(b, 1010, 0);
  f.allocator.free(c, 2000, 0);
  EXPECT_EQ(f.allocator.stats(0).cached_bytes, 3072u);
  EXPECT_EQ(f.device->releases, 0);  // freeing keeps the memory
  f.allocator.release_cached();
  EXPECT_EQ(f.device->releases, 2);
  EXPECT_EQ(f.device->used, 0u);
  EXPECT_EQ(f.allocator.stats(0).cached_bytes, 0u);
}

TEST(CachingAllocatorPolicy, DevicesHaveSeparateCaches) {
  Fixture f(1 << 20);
  void* a = f.allocator.alloc(4096, 0);
  f.allocator.free(a, 4096, 0);
  void* b = f.allocator.alloc(4096, 1);  // device 1 must not get device 0's block
  EXPECT_NE(a, b);
  EXPECT_EQ(f.allocator.stats(1).in_use_bytes, 4096u);
  EXPECT_EQ(f.allocator.stats(0).cached_bytes, 4096u);
  f.allocator.free(b, 4096, 1);
}

TEST(CachingAllocatorPolicy, OutOfMemoryEmptiesTheCacheAndRetries) {
  Fixture f(8192);
  void* a = f.allocator.alloc(6000, 0);  // class 6144
  f.allocator.free(a, 6000, 0);          // cached, still holding the device memory
  void* b = f.allocator.alloc(4096, 0);  // does not fit beside the cached block: cache released
  EXPECT_NE(b, nullptr);
  EXPECT_EQ(f.device->releases, 1);
  EXPECT_EQ(f.allocator.stats(0).cached_bytes, 0u);
  try {
    f.allocator.alloc(8192, 0);
    FAIL() << "allocated beyond capacity";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA out of memory on cuda:0"), std::string::npos) << e.what();
  }
  f.allocator.free(b, 4096, 0);
}

TEST(CachingAllocatorPolicy, MisuseIsAnError) {
  Fixture f(1 << 20);
  int not_ours = 0;
  EXPECT_THROW(f.allocator.free(&not_ours, 4, 0), Error);
  void* a = f.allocator.alloc(1000, 0);
  EXPECT_THROW(f.allocator.free(a, 100000, 0), Error);  // wrong size
  EXPECT_THROW(f.allocator.free(a, 1000, 1), Error);    // wrong device
  f.allocator.free(a, 1000, 0);
  EXPECT_THROW(f.allocator.free(a, 1000, 0), Error);  // double free
  EXPECT_EQ(f.allocator.alloc(0, 0), nullptr);
}

using GpuAllocator = GpuTest;

TEST_F(GpuAllocator, ReusesBlocksInsteadOfCallingCudaMalloc) {
  cuda::release_cached();
  const cuda::AllocatorStats before = cuda::allocator_stats(0);
  void* a = device_alloc(gpu(), 3000);
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(cuda::is_device_pointer(a));
  device_free(gpu(), a, 3000);
  void* b = device_alloc(gpu(), 3000);
  EXPECT_EQ(a, b);
  const cuda::AllocatorStats after = cuda::allocator_stats(0);
  EXPECT_EQ(after.device_mallocs - before.device_mallocs, 1);
  EXPECT_EQ(after.cache_hits - before.cache_hits, 1);
  device_free(gpu(), b, 3000);
  cuda::release_cached();
  EXPECT_EQ(cuda::allocator_stats(0).cached_bytes, 0u);
}

TEST_F(GpuAllocator, TensorsOfARepeatedStepStopAllocating) {
  cuda::release_cached();
  auto step = [&] {
    Tensor a = Tensor::zeros({64, 128}, gpu());
    Tensor b = Tensor::zeros({128}, gpu());
    Tensor c = Tensor::zeros({7, 9, 11}, gpu());
  };
  step();
  const int64_t mallocs = cuda::allocator_stats(0).device_mallocs;
  for (int i = 0; i < 10; ++i) step();
  EXPECT_EQ(cuda::allocator_stats(0).device_mallocs, mallocs);
}

TEST_F(GpuAllocator, HostMemoryIsNotDeviceMemory) {
  std::vector<float> host(16);
  EXPECT_FALSE(cuda::is_device_pointer(host.data()));
  EXPECT_FALSE(cuda::is_device_pointer(nullptr));
}

}  // namespace
}  // namespace dtrain
