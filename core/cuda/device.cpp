// Device discovery and selection for the CUDA runtime: count (never throws), the process-wide
// pinned device, PCI bus ids, pointer classification.
#include <atomic>
#include <string>

#include <fmt/format.h>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/device_guard.h"

namespace dtrain::cuda {

namespace {

struct Probe {
  int count = 0;
  std::string error;
};

// Visibility cannot change within a process (CUDA reads CUDA_VISIBLE_DEVICES once), so ask once.
const Probe& probe() {
  static const Probe result = [] {
    Probe p;
    int n = 0;
    const cudaError_t status = cudaGetDeviceCount(&n);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky, but would surface in the next launch check
      p.error = fmt::format("cudaGetDeviceCount: {}", cudaGetErrorString(status));
      return p;
    }
    p.count = n;
    if (n == 0) p.error = "cudaGetDeviceCount returned 0 devices";
    return p;
  }();
  return result;
}

// The device set_device() chose for the process; -1 until then.
std::atomic<int> g_pinned_device{-1};

}  // namespace

int device_count() {
  try {
    return probe().count;
  } catch (...) {
    return 0;
  }
}

std::string device_count_error() { return probe().error; }

void set_device(int index) {
  const int n = device_count();
  if (index < 0 || index >= n) {
    throw Error(n == 0 ? fmt::format("CUDA device {} requested but no CUDA device is visible ({})", index,
                                     device_count_error())
                       : fmt::format("CUDA device {} requested but only {} visible (logical indices 0..{})", index,
                                     n, n - 1));
  }
  CUDA_CHECK(cudaSetDevice(index));
  g_pinned_device.store(index, std::memory_order_release);
}

int current_device() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const int pinned = g_pinned_device.load(std::memory_order_acquire);
  if (pinned >= 0 && device != pinned) {
    CUDA_CHECK(cudaSetDevice(pinned));
    device = pinned;
  }
  return device;
}

std::string pci_bus_id(int index) {
  char buf[64] = {};
  CUDA_CHECK(cudaDeviceGetPCIBusId(buf, static_cast<int>(sizeof buf), index));
  return buf;
}

bool is_device_pointer(const void* ptr) {
  if (!ptr) return false;
  cudaPointerAttributes attributes{};
  const cudaError_t status = cudaPointerGetAttributes(&attributes, ptr);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

}  // namespace dtrain::cuda
