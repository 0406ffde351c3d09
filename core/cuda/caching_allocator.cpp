// CachingAllocator's policy (see caching_allocator.h); knows nothing of CUDA.
#include "core/cuda/caching_allocator.h"

#include <bit>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain::cuda {

namespace {

constexpr size_t kMinBlock = 512;
constexpr size_t kLargeBlock = size_t{64} << 20;
constexpr size_t kLargeStep = size_t{2} << 20;

std::string human_bytes(size_t bytes) {
  if (bytes >= (size_t{1} << 30)) return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1 << 30));
  if (bytes >= (size_t{1} << 20)) return fmt::format("{:.2f} MiB", static_cast<double>(bytes) / (1 << 20));
  return fmt::format("{} bytes", bytes);
}

size_t round_up(size_t x, size_t step) { return (x + step - 1) / step * step; }

}  // namespace

CachingAllocator::CachingAllocator(std::unique_ptr<Backend> backend) : backend_(std::move(backend)) {}

CachingAllocator::~CachingAllocator() {
  try {
    std::lock_guard lock(mutex_);
    release_cached_locked(-1);
  } catch (...) {
    // Tear-down after a device failure: the process is ending, nothing useful to report.
  }
}

size_t CachingAllocator::round_size(size_t bytes) {
  if (bytes <= kMinBlock) return kMinBlock;
  if (bytes >= kLargeBlock) return round_up(bytes, kLargeStep);
  const size_t octave = std::bit_floor(bytes);  // >= 512, so octave / 4 >= 128
  return round_up(bytes, octave / 4);
}

void* CachingAllocator::alloc(size_t bytes, int device) {
  if (bytes == 0) return nullptr;
  const size_t size = round_size(bytes);
  std::lock_guard lock(mutex_);
  Pool& pool = pools_[device];
  auto it = pool.free_blocks.find(size);
  if (it != pool.free_blocks.end() && !it->second.empty()) {
    void* ptr = it->second.back();
    it->second.pop_back();
    pool.stats.cached_bytes -= size;
    pool.stats.in_use_bytes += size;
    ++pool.stats.cache_hits;
    in_use_.emplace(ptr, Block{size, device});
    return ptr;
  }
  void* ptr = backend_->allocate(size, device);
  if (!ptr) {
    // Cached blocks of other size classes may be what stands in the way: give them back, retry.
    release_cached_locked(device);
    ptr = backend_->allocate(size, device);
  }
  if (!ptr) {
    throw Error(fmt::format("CUDA out of memory on cuda:{}: allocating {} ({} in use by dtrain tensors)", device,
                            human_bytes(size), human_bytes(pool.stats.in_use_bytes)),
                ErrorKind::kResources);
  }
  ++pool.stats.device_mallocs;
  pool.stats.in_use_bytes += size;
  in_use_.emplace(ptr, Block{size, device});
  return ptr;
}

void CachingAllocator::free(void* ptr, size_t bytes, int device) {
  if (!ptr) return;
  std::lock_guard lock(mutex_);
  auto it = in_use_.find(ptr);
  DTRAIN_CHECK(it != in_use_.end(), "freeing {} on cuda:{}, which the CUDA allocator did not hand out", ptr, device);
  const Block block = it->second;
  DTRAIN_CHECK(block.device == device && block.size == round_size(bytes),
               "freeing a block of {} bytes on cuda:{} as {} bytes on cuda:{}", block.size, block.device, bytes,
               device);
  in_use_.erase(it);
  Pool& pool = pools_[device];
  pool.free_blocks[block.size].push_back(ptr);
  pool.stats.in_use_bytes -= block.size;
  pool.stats.cached_bytes += block.size;
}

void CachingAllocator::release_cached() {
  std::lock_guard lock(mutex_);
  release_cached_locked(-1);
}

void CachingAllocator::release_cached_locked(int device) {
  for (auto& [pool_device, pool] : pools_) {
    if (device >= 0 && pool_device != device) continue;
    for (auto& [size, blocks] : pool.free_blocks) {
      while (!blocks.empty()) {
        backend_->release(blocks.back(), pool_device);
        blocks.pop_back();
        pool.stats.cached_bytes -= size;
      }
    }
    pool.free_blocks.clear();
  }
}

AllocatorStats CachingAllocator::stats(int device) const {
  std::lock_guard lock(mutex_);
  auto it = pools_.find(device);
  return it == pools_.end() ? AllocatorStats{} : it->second.stats;
}

}  // namespace dtrain::cuda
