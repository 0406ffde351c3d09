// HostAllocator: blocks are reused by size class, grow only when a larger class is asked for,
// are aligned, and a repeated pattern of requests stops reaching the system after its first round.
#include "core/host_allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace dtrain {
namespace {

TEST(HostAllocator, FreedBlockServesTheNextRequestOfItsClass) {
  HostAllocator alloc;
  void* a = alloc.alloc(1000);
  alloc.free(a, 1000);
  void* b = alloc.alloc(900);  // 900 and 1000 share the 1024-byte class
  EXPECT_EQ(b, a);
  const HostAllocatorStats s = alloc.stats();
  EXPECT_EQ(s.system_allocs, 1);
  EXPECT_EQ(s.cache_hits, 1);
  EXPECT_EQ(s.in_use_bytes, HostAllocator::round_size(1000));
  EXPECT_EQ(s.cached_bytes, 0u);
  alloc.free(b, 900);
}

TEST(HostAllocator, ALargerRequestGetsANewBlockAndTheCacheKeepsTheOld) {
  HostAllocator alloc;
  void* small = alloc.alloc(4096);
  alloc.free(small, 4096);
  void* large = alloc.alloc(1 << 20);
  EXPECT_NE(large, small);
  HostAllocatorStats s = alloc.stats();
  EXPECT_EQ(s.system_allocs, 2);
  EXPECT_EQ(s.cached_bytes, HostAllocator::round_size(4096));
  EXPECT_EQ(s.in_use_bytes, HostAllocator::round_size(1 << 20));
  alloc.free(large, 1 << 20);
  alloc.release_cached();
  s = alloc.stats();
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.in_use_bytes, 0u);
}

TEST(HostAllocator, BlocksAreAlignedForVectorLoadsAndHugePages) {
  HostAllocator alloc;
  for (size_t bytes : {size_t{1}, size_t{3}, size_t{100}, size_t{4097}, size_t{1} << 20, (size_t{2} << 20) + 12345,
                       size_t{70} << 20}) {
    void* p = alloc.alloc(bytes);
    const size_t want = bytes >= HostAllocator::kHugeAlignment ? HostAllocator::kHugeAlignment : HostAllocator::kAlignment;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % want, 0u) << bytes << " bytes";
    alloc.free(p, bytes);
  }
}

TEST(HostAllocator, SizeClassesCoverTheRequestWithAtMostAQuarterSlack) {
  size_t previous = 0;
  for (size_t bytes = 1; bytes < (size_t{200} << 20); bytes = bytes * 9 / 8 + 1) {
    const size_t c = HostAllocator::round_size(bytes);
    EXPECT_GE(c, bytes);
    EXPECT_LE(c, std::max<size_t>(512, bytes + bytes / 4)) << bytes;
    EXPECT_GE(c, previous) << "classes grow with the request";
    EXPECT_EQ(HostAllocator::round_size(c), c) << "a class is its own class";
    previous = c;
  }
}

TEST(HostAllocator, ARepeatedStepReachesTheSystemOnlyInItsFirstRound) {
  HostAllocator alloc;
  // A step's buffers: several sizes, one size twice, freed in another order than taken.
  const std::vector<size_t> sizes = {256 * 4, 64 * 784 * 4, 64 * 784 * 4, 25 * 50176 * 4, 10 * 4, 6 * 28 * 28 * 64 * 4};
  auto step = [&] {
    std::vector<void*> blocks;
    for (size_t s : sizes) blocks.push_back(alloc.alloc(s));
    for (size_t i : {3, 0, 5, 1, 4, 2}) alloc.free(blocks[i], sizes[i]);
  };
  step();
  const HostAllocatorStats first = alloc.stats();
  for (int i = 0; i < 1000; ++i) step();
  const HostAllocatorStats after = alloc.stats();
  EXPECT_EQ(after.system_allocs, first.system_allocs);
  EXPECT_EQ(after.cached_bytes, first.cached_bytes) << "no block is lost or added";
  EXPECT_EQ(after.in_use_bytes, 0u);
  EXPECT_EQ(after.cache_hits, first.cache_hits + 1000 * static_cast<int64_t>(sizes.size()));
}

TEST(HostAllocator, CpuTensorsComeFromTheProcessAllocator) {
  HostAllocator& alloc = HostAllocator::instance();
  { Tensor warm = Tensor::empty({123, 45}); }  // its block is cached now
  const HostAllocatorStats before = alloc.stats();
  for (int i = 0; i < 100; ++i) {
    Tensor t = Tensor::empty({123, 45});
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % HostAllocator::kAlignment, 0u);
  }
  const HostAllocatorStats after = alloc.stats();
  EXPECT_EQ(after.system_allocs, before.system_allocs);
  EXPECT_EQ(after.cache_hits, before.cache_hits + 100);
}

}  // namespace
}  // namespace dtrain
