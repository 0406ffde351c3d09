// CachingAllocator: size-class free lists over a raw device allocator. Freed blocks go back
// to a per-device cache and serve later requests of the same size class, so a training step
// that allocates the same shapes every iteration stops calling cudaMalloc (which synchronises
// the device) after the first step. No CUDA headers: the policy is tested with a fake backend.
//
// Stream safety: a cached block may be handed out again while kernels that used it are still
// queued. That is safe because dtrain queues all tensor work on the one compute stream, so the
// new owner's work runs after the old owner's; work on other streams (NCCL) must be joined
// into the compute stream (Work::wait) before its buffers are freed.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/cuda/cuda_backend.h"

namespace dtrain::cuda {

class CachingAllocator {
 public:
  class Backend {
   public:
    virtual ~Backend() = default;
    // A block of exactly `bytes` on `device`; nullptr when the device is out of memory.
    virtual void* allocate(size_t bytes, int device) = 0;
    virtual void release(void* ptr, int device) = 0;
  };

  explicit CachingAllocator(std::unique_ptr<Backend> backend);
  ~CachingAllocator();  // returns the cached blocks (blocks still in use are the owners' problem)
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Throws dtrain::Error on out-of-memory, after returning the cache to the device and retrying.
  void* alloc(size_t bytes, int device);
  // `bytes` and `device` must be those given to alloc() (checked).
  void free(void* ptr, size_t bytes, int device);
  void release_cached();
  AllocatorStats stats(int device) const;

  // The size class of a request: 512 B minimum; below 64 MiB, four classes per power of two
  // (at most 25% slack); from 64 MiB on, multiples of 2 MiB.
  static size_t round_size(size_t bytes);

 private:
  struct Pool {
    std::unordered_map<size_t, std::vector<void*>> free_blocks;  // size class -> blocks
    AllocatorStats stats;
  };
  struct Block {
    size_t size;
    int device;
  };

  void release_cached_locked(int device);  // device < 0: every device

  std::unique_ptr<Backend> backend_;
  mutable std::mutex mutex_;
  std::unordered_map<int, Pool> pools_;
  std::unordered_map<void*, Block> in_use_;
};

}  // namespace dtrain::cuda
