// GpuTest: the fixture every single-process GPU test uses. It skips the test, saying why,
// when no CUDA device is visible, and otherwise pins the process to device 0. max_rel_diff: the
// parity tests' measure of a GPU result against the CPU's.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "core/cuda/cuda_backend.h"
#include "core/device.h"
#include "core/tensor.h"

namespace dtrain::testing {

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) {
      GTEST_SKIP() << "no CUDA device visible (" << cuda::device_count_error() << ")";
    }
    cuda::set_device(0);
  }
  static Device gpu() { return Device::cuda(0); }
};

// Largest absolute difference, relative to the largest CPU magnitude (floored at 1e-3).
inline double max_rel_diff(const Tensor& cpu, const Tensor& gpu) {
  const std::vector<float> a = cpu.to_vector(), b = gpu.to_vector();
  EXPECT_EQ(a.size(), b.size());
  double scale = 1e-3, worst = 0;
  for (float x : a) scale = std::max(scale, static_cast<double>(std::abs(x)));
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
  return worst / scale;
}

}  // namespace dtrain::testing
