// Raw device memory: allocation and copies between host and devices. The only place that
// knows which allocator backs which device (CPU: the caching allocator in
// core/host_allocator.h; CUDA: the caching allocator in core/cuda/allocator.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/device.h"

namespace dtrain {

void* device_alloc(Device device, size_t bytes);
void device_free(Device device, void* ptr, size_t bytes);

// Copies bytes between any two devices; returns when the destination holds the data.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);

// Sets bytes to zero on the device.
void zero_bytes(void* dst, Device device, size_t bytes);

// This machine's physical memory in bytes: what host allocations are weighed against, so a
// request that cannot fit is refused by name rather than met by the kernel's OOM killer.
int64_t host_memory_bytes();

// "3.1 GB": a byte count for error messages (decimal units, one decimal).
std::string format_bytes(double bytes);

}  // namespace dtrain
