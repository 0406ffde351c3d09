// The process's CUDA caching allocator: CachingAllocator over cudaMalloc/cudaFree (device
// memory only; never managed memory), behind cuda::alloc / free / release_cached.
#include <memory>

#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/device_guard.h"

namespace dtrain::cuda {

namespace {

class CudaMallocBackend final : public CachingAllocator::Backend {
 public:
  void* allocate(size_t bytes, int device) override {
    DeviceGuard guard(device);
    void* ptr = nullptr;
    const cudaError_t status = cudaMalloc(&ptr, bytes);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear it: the caller retries after emptying the cache
      return nullptr;
    }
    if (status != cudaSuccess) check_failed(__FILE__, __LINE__, "cudaMalloc", cudaGetErrorString(status));
    return ptr;
  }
  void release(void* ptr, int device) override {
    DeviceGuard guard(device);
    CUDA_CHECK(cudaFree(ptr));
  }
};

// Never destroyed: tensors in static storage may be freed after it would have been, and
// cudaFree during exit races the CUDA runtime's own tear-down.
CachingAllocator& allocator() {
  static auto* instance = new CachingAllocator(std::make_unique<CudaMallocBackend>());
  return *instance;
}

}  // namespace

void* alloc(size_t bytes, int device) { return allocator().alloc(bytes, device); }

void free(void* ptr, size_t bytes, int device) { allocator().free(ptr, bytes, device); }

void release_cached() { allocator().release_cached(); }

AllocatorStats allocator_stats(int device) { return allocator().stats(device); }

}  // namespace dtrain::cuda
