// The GPU backend library is opened only when a run asks for CUDA (Note [Loaded on use]): a CPU
// run, or an automatic choice on a machine without an NVIDIA driver, maps none of cudart,
// cuBLAS or NCCL. Each gtest case runs in a process of its own, so nothing is loaded at start.
#include "core/gpu_backend.h"

#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "comm/gpu_plugins.h"
#include "core/device_select.h"

namespace dtrain {
namespace {

bool mapped(const std::string& library) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find(library) != std::string::npos) return true;
  return false;
}

TEST(GpuBackend, CpuRunsNeverOpenIt) {
  if (!gpu_backend_available()) GTEST_SKIP() << "CPU-only build: no libdtrain_cuda.so";
  ASSERT_FALSE(mapped("libdtrain_cuda.so")) << "loaded before anything asked for it";
  install_gpu_backend_loader();  // as dtrain::init() does: installing the loader opens nothing
  EXPECT_EQ(select_device(DeviceRequest::cpu(), 0, 1, false).device, Device::cpu());
  if (!gpu_driver_present()) {
    // Without a driver there is nothing to count: auto decides for the CPU without opening it.
    const DeviceInventory inventory = probe_devices();
    EXPECT_EQ(inventory.count, 0);
    EXPECT_NE(inventory.count_error.find("no NVIDIA driver"), std::string::npos) << inventory.count_error;
  }
  EXPECT_FALSE(mapped("libdtrain_cuda.so"));
  EXPECT_FALSE(mapped("libcudart"));
  EXPECT_FALSE(mapped("libcublas"));
  EXPECT_FALSE(mapped("libnccl"));
}

TEST(GpuBackend, OpensOnFirstUseAndCountsDevices) {
  if (!gpu_backend_available()) GTEST_SKIP() << "CPU-only build: no libdtrain_cuda.so";
  install_gpu_backend_loader();  // as dtrain::init() does: core opens no plugin itself
  GpuBackend& backend = gpu_backend();
  const int count = backend.device_count();  // never throws; 0 without a driver or device
  EXPECT_GE(count, 0);
  if (count == 0) {
    EXPECT_FALSE(backend.device_count_error().empty());
  }
  EXPECT_TRUE(mapped("libdtrain_cuda.so"));
  EXPECT_TRUE(mapped("libcudart"));
  EXPECT_EQ(&gpu_backend(), &backend) << "opened once";
}

}  // namespace
}  // namespace dtrain
