#include "core/memory.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "core/error.h"
#include "core/gpu_backend.h"
#include "core/host_allocator.h"

namespace dtrain {

void* device_alloc(Device device, size_t bytes) {
  if (bytes == 0) return nullptr;
  if (device.is_cpu()) return HostAllocator::instance().alloc(bytes);
  return gpu_backend().alloc(bytes, device.index);
}

void device_free(Device device, void* ptr, size_t bytes) {
  if (!ptr) return;
  if (device.is_cpu()) {
    HostAllocator::instance().free(ptr, bytes);
    return;
  }
  gpu_backend().free(ptr, bytes, device.index);
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  gpu_backend().copy(dst, dst_device.is_cuda(), src, src_device.is_cuda(), bytes);
}

void zero_bytes(void* dst, Device device, size_t bytes) {
  if (bytes == 0) return;
  if (device.is_cpu()) {
    std::memset(dst, 0, bytes);
    return;
  }
  gpu_backend().zero(dst, bytes);
}

int64_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return INT64_MAX;  // unknown: refuse nothing on this ground
  return static_cast<int64_t>(pages) * page;
}

std::string format_bytes(double bytes) {
  if (bytes >= 1e9) return fmt::format("{:.1f} GB", bytes / 1e9);
  if (bytes >= 1e6) return fmt::format("{:.1f} MB", bytes / 1e6);
  if (bytes >= 1e3) return fmt::format("{:.1f} kB", bytes / 1e3);
  return fmt::format("{} bytes", static_cast<int64_t>(bytes));
}

}  // namespace dtrain
