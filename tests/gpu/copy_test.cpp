// Copies between host and device, device and device, and memset: contents survive round
// trips of awkward sizes, and copies are ordered after the kernels queued before them.
#include <cstdint>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "core/memory.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "tests/gpu/gpu_test.h"

namespace dtrain {
namespace {

using GpuCopy = testing::GpuTest;

TEST_F(GpuCopy, HostDeviceHostRoundTripKeepsEveryByte) {
  for (size_t bytes : {size_t{1}, size_t{3}, size_t{4096}, (size_t{1} << 20) + 7}) {
    std::vector<uint8_t> src(bytes), back(bytes, 0);
    for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
    void* d1 = device_alloc(gpu(), bytes);
    void* d2 = device_alloc(gpu(), bytes);
    copy_bytes(d1, gpu(), src.data(), Device::cpu(), bytes);
    copy_bytes(d2, gpu(), d1, gpu(), bytes);  // device to device
    copy_bytes(back.data(), Device::cpu(), d2, gpu(), bytes);
    EXPECT_EQ(back, src) << bytes << " bytes";
    device_free(gpu(), d1, bytes);
    device_free(gpu(), d2, bytes);
  }
}

TEST_F(GpuCopy, ZeroClearsDeviceMemory) {
  std::vector<float> ones(1001, 1.0f);
  Tensor t = Tensor::from_vector(ones, {1001}, gpu());
  t.zero_();
  EXPECT_EQ(t.to_vector(), std::vector<float>(1001, 0.0f));
}

TEST_F(GpuCopy, TensorsMoveBetweenCpuAndGpu) {
  std::vector<float> v(257);
  std::iota(v.begin(), v.end(), -100.0f);
  Tensor cpu = Tensor::from_vector(v, {257});
  Tensor gpu_t = cpu.to(gpu());
  EXPECT_EQ(gpu_t.device(), gpu());
  EXPECT_EQ(gpu_t.to(Device::cpu()).to_vector(), v);
}

TEST_F(GpuCopy, CopyToHostSeesTheKernelsQueuedBeforeIt) {
  // No explicit synchronize: the copy runs on the compute stream after the kernels.
  Tensor t = Tensor::zeros({1 << 22}, gpu());
  for (int i = 0; i < 20; ++i) fill(t, static_cast<float>(i));
  scale(t, 2.0f);
  std::vector<float> host = t.to_vector();
  EXPECT_EQ(host.front(), 38.0f);
  EXPECT_EQ(host.back(), 38.0f);
}

}  // namespace
}  // namespace dtrain
