// GpuTest: the fixture every single-process GPU test uses. It skips the test, saying why,
// when no CUDA device is visible, and otherwise pins the process to device 0.
#pragma once

#include <gtest/gtest.h>

#include "core/cuda/cuda_backend.h"
#include "core/device.h"

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

}  // namespace dtrain::testing
