// HostBufferPool: a snapshot's buffers come back once written and the next snapshot reuses them.
#include "checkpoint/host_buffer_pool.h"

#include <cstring>
#include <thread>

#include <gtest/gtest.h>

#include "checkpoint/safetensors.h"

namespace dtrain::checkpoint {
namespace {

TEST(HostBufferPool, ReusesAReleasedBufferOfTheSameSize) {
  HostBufferPool pool;
  std::byte* first = nullptr;
  {
    auto a = pool.get(3 << 20);
    first = a.get();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % (2 << 20), 0u) << "large buffers are huge-page aligned";
    EXPECT_EQ(pool.free_bytes(), 0u);
  }
  EXPECT_EQ(pool.free_bytes(), size_t{3} << 20);
  auto other = pool.get(1000);  // another size: a new buffer
  EXPECT_NE(other.get(), first);
  auto again = pool.get(3 << 20);
  EXPECT_EQ(again.get(), first);
  EXPECT_EQ(pool.free_bytes(), 0u);
}

TEST(HostBufferPool, BuffersMayOutliveThePoolAndReturnFromOtherThreads) {
  std::shared_ptr<std::byte> kept;
  {
    HostBufferPool pool;
    kept = pool.get(4096);
    auto moved = pool.get(4096);
    std::thread([b = std::move(moved)]() mutable { b.reset(); }).join();
    EXPECT_EQ(pool.free_bytes(), 4096u);
  }
  kept.get()[4095] = std::byte{1};
  kept.reset();  // returns to the pool's state, which the buffer kept alive
}

TEST(HostBufferPool, HostCopyIntoPooledMemoryKeepsTheValues) {
  HostBufferPool pool;
  Tensor t = Tensor::from_vector(std::vector<float>{1.f, 2.f, 3.f}, {3});
  safetensors::HostTensor h = safetensors::host_copy("t", t, &pool);
  t.zero_();
  std::vector<float> back(3);
  std::memcpy(back.data(), h.data.get(), 12);
  EXPECT_EQ(back, (std::vector<float>{1.f, 2.f, 3.f}));
}

}  // namespace
}  // namespace dtrain::checkpoint
