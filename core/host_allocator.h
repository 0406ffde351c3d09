// HostAllocator: size-class free lists over aligned host memory, behind device_alloc and
// device_free for the CPU (core/memory.cpp). A freed block goes back to its class's free list
// and serves the next request of that class, so a training step that allocates the same shapes
// every iteration stops calling the system allocator after its first step: no malloc, no mmap,
// and no page faults on fresh pages (glibc returns large blocks to the kernel on free, and a
// new block is first-touched page by page). The same policy as the CUDA caching allocator
// (core/cuda/caching_allocator.h); memory is kept until release_cached().
//
// Steady state without allocating: the free lists are vectors whose capacity stays once grown,
// and the size of a block is recomputed from the size its owner frees it with (device_free
// always passes it), so alloc and free touch no heap node.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

namespace dtrain {

struct HostAllocatorStats {
  size_t in_use_bytes = 0;     // handed out and not yet freed (rounded sizes)
  size_t cached_bytes = 0;     // free blocks kept for reuse
  int64_t system_allocs = 0;   // requests that reached the system allocator
  int64_t cache_hits = 0;      // requests served from a free list
};

class HostAllocator {
 public:
  HostAllocator() = default;
  ~HostAllocator();  // returns the cached blocks; blocks still in use are their owners' problem
  HostAllocator(const HostAllocator&) = delete;
  HostAllocator& operator=(const HostAllocator&) = delete;

  // The process-wide allocator behind device_alloc(Device::cpu(), ...). Never destroyed, so
  // tensors that outlive main (static ones) can still free into it.
  static HostAllocator& instance();

  // At least `bytes`, aligned to kAlignment (kHugeAlignment from kHugeAlignment bytes on).
  // Throws dtrain::Error when the system has no memory left, after releasing the cache and
  // retrying. bytes == 0 gives nullptr.
  void* alloc(size_t bytes);
  // `bytes` must be the size given to alloc() for this pointer.
  void free(void* ptr, size_t bytes);
  void release_cached();
  HostAllocatorStats stats() const;

  // The size class of a request: 512 B minimum; below 64 MiB, four classes per power of two
  // (at most 25% slack); from 64 MiB on, multiples of 2 MiB.
  static size_t round_size(size_t bytes);

  static constexpr size_t kAlignment = 64;              // a cache line; what AVX-512 loads like
  static constexpr size_t kHugeAlignment = size_t{2} << 20;  // a transparent huge page

 private:
  void release_cached_locked();

  mutable std::mutex mutex_;
  std::map<size_t, std::vector<void*>> free_blocks_;  // size class -> cached blocks
  HostAllocatorStats stats_;
};

}  // namespace dtrain
