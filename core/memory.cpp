#include "core/memory.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "core/error.h"
#include "core/host_allocator.h"
#ifdef DTRAIN_WITH_CUDA
#include "core/cuda/cuda_backend.h"
#endif

namespace dtrain {

namespace {
[[noreturn, maybe_unused]] void no_cuda() { throw Error("this dtrain binary was built without CUDA"); }
}  // namespace

void* device_alloc(Device device, size_t bytes) {
  if (bytes == 0) return nullptr;
  if (device.is_cpu()) return HostAllocator::instance().alloc(bytes);
#ifdef DTRAIN_WITH_CUDA
  return cuda::alloc(bytes, device.index);
#else
  no_cuda();
#endif
}

void device_free(Device device, void* ptr, size_t bytes) {
  if (!ptr) return;
  if (device.is_cpu()) {
    HostAllocator::instance().free(ptr, bytes);
    return;
  }
#ifdef DTRAIN_WITH_CUDA
  cuda::free(ptr, bytes, device.index);
#else
  (void)bytes;
  no_cuda();
#endif
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
#ifdef DTRAIN_WITH_CUDA
  cuda::copy(dst, dst_device.is_cuda(), src, src_device.is_cuda(), bytes);
#else
  no_cuda();
#endif
}

void zero_bytes(void* dst, Device device, size_t bytes) {
  if (bytes == 0) return;
  if (device.is_cpu()) {
    std::memset(dst, 0, bytes);
    return;
  }
#ifdef DTRAIN_WITH_CUDA
  cuda::zero(dst, bytes);
#else
  no_cuda();
#endif
}

}  // namespace dtrain
