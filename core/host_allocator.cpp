// HostAllocator (see host_allocator.h): the size classes, the free lists and the system calls.
#include "core/host_allocator.h"

#include <sys/mman.h>

#include <bit>
#include <cstdlib>

#include <fmt/format.h>

#include "core/error.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace dtrain {

namespace {

// Under AddressSanitizer a cached block is poisoned while it waits in a free list, and a block
// handed out is addressable only up to the bytes asked for: the cache must not hide a
// use-after-free or an overflow into the rounding (the sanitizer CI job exists to find those).
#if defined(__SANITIZE_ADDRESS__)
void poison(void* p, size_t n) { ASAN_POISON_MEMORY_REGION(p, n); }
void unpoison(void* p, size_t n) { ASAN_UNPOISON_MEMORY_REGION(p, n); }
#else
void poison(void*, size_t) {}
void unpoison(void*, size_t) {}
#endif

// Hands out `size` bytes of which the first `bytes` are addressable.
void* hand_out(void* p, size_t bytes, size_t size) {
  unpoison(p, bytes);
  poison(static_cast<char*>(p) + bytes, size - bytes);
  return p;
}

constexpr size_t kMinBlock = 512;
constexpr size_t kLargeBlock = size_t{64} << 20;
constexpr size_t kLargeStep = size_t{2} << 20;

size_t round_up(size_t x, size_t step) { return (x + step - 1) / step * step; }

// Large blocks start on a huge-page boundary and ask for transparent huge pages (the kernel's
// "madvise" mode is common): a 5 MB im2col buffer then costs 3 page faults on first touch instead
// of 1,280, and fewer TLB misses in every pass over it. A refusal changes nothing but speed.
void* system_alloc(size_t size) {
  const size_t alignment = size >= HostAllocator::kHugeAlignment ? HostAllocator::kHugeAlignment
                                                                 : HostAllocator::kAlignment;
  void* p = std::aligned_alloc(alignment, round_up(size, alignment));
  if (p && alignment == HostAllocator::kHugeAlignment) madvise(p, round_up(size, alignment), MADV_HUGEPAGE);
  return p;
}

}  // namespace

HostAllocator& HostAllocator::instance() {
  static HostAllocator* allocator = new HostAllocator();  // leaked on purpose: see the header
  return *allocator;
}

HostAllocator::~HostAllocator() {
  std::lock_guard lock(mutex_);
  release_cached_locked();
}

size_t HostAllocator::round_size(size_t bytes) {
  if (bytes <= kMinBlock) return kMinBlock;
  if (bytes >= kLargeBlock) return round_up(bytes, kLargeStep);
  const size_t octave = std::bit_floor(bytes);  // >= 512, so octave / 4 >= 128
  return round_up(bytes, octave / 4);
}

void* HostAllocator::alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t size = round_size(bytes);
  std::lock_guard lock(mutex_);
  auto it = free_blocks_.find(size);
  if (it != free_blocks_.end() && !it->second.empty()) {
    void* ptr = it->second.back();
    it->second.pop_back();
    stats_.cached_bytes -= size;
    stats_.in_use_bytes += size;
    ++stats_.cache_hits;
    return hand_out(ptr, bytes, size);
  }
  void* ptr = system_alloc(size);
  if (!ptr) {  // cached blocks of other classes may be what stands in the way: release, retry
    release_cached_locked();
    ptr = system_alloc(size);
  }
  if (!ptr)
    throw Error(fmt::format("out of host memory allocating {} bytes ({} bytes in use by dtrain tensors)", bytes,
                            stats_.in_use_bytes),
                ErrorKind::kResources);
  ++stats_.system_allocs;
  stats_.in_use_bytes += size;
  return hand_out(ptr, bytes, size);
}

void HostAllocator::free(void* ptr, size_t bytes) {
  if (!ptr) return;
  const size_t size = round_size(bytes);
  std::lock_guard lock(mutex_);
  DTRAIN_CHECK(stats_.in_use_bytes >= size, "freeing {} bytes on the host with {} bytes in use", bytes,
               stats_.in_use_bytes);
  poison(ptr, size);
  free_blocks_[size].push_back(ptr);
  stats_.in_use_bytes -= size;
  stats_.cached_bytes += size;
}

void HostAllocator::release_cached() {
  std::lock_guard lock(mutex_);
  release_cached_locked();
}

void HostAllocator::release_cached_locked() {
  for (auto& [size, blocks] : free_blocks_) {
    for (void* p : blocks) {
      unpoison(p, size);
      std::free(p);
    }
    stats_.cached_bytes -= size * blocks.size();
  }
  free_blocks_.clear();
}

HostAllocatorStats HostAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace dtrain
