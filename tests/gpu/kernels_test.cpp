// The elementwise kernels of core/kernels.h on the GPU give what the CPU path gives: the same
// functor bodies run in the grid-stride kernel, so any difference is a launch or copy bug (or,
// for Axpy, the GPU's fused multiply-add, hence its tolerance).
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "core/kernels.h"
#include "core/memory.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "tests/gpu/gpu_test.h"

namespace dtrain {
namespace {

using testing::GpuTest;

// Inputs that exercise rounding, signed zero, subnormals, the fp16 range edges, inf and NaN.
std::vector<float> tricky_values() {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f,     -0.0f,   1.0f,     -1.0f,    0.1f,      1.0f / 3,  65504.0f, 65519.0f,
                          65520.0f, 1e6f,    -1e6f,    6.1e-5f,  5.96e-8f,  2.98e-8f, 1e-30f,   1e-45f,
                          3.0e38f,  inf,     -inf,     std::numeric_limits<float>::quiet_NaN(), 1.00390625f,
                          1.01171875f, 2049.0f, -2051.0f};
  for (int i = 0; i < 4096; ++i) v.push_back(std::ldexp(static_cast<float>(i % 97) - 48.5f, (i % 61) - 30));
  return v;
}

template <class T>
std::vector<T> download(const void* device_ptr, size_t n) {
  std::vector<T> host(n);
  copy_bytes(host.data(), Device::cpu(), device_ptr, Device::cuda(0), n * sizeof(T));
  return host;
}

// A device buffer of n T's, freed on scope exit.
template <class T>
struct DeviceBuffer {
  size_t n;
  T* ptr;
  explicit DeviceBuffer(size_t count) : n(count), ptr(static_cast<T*>(device_alloc(Device::cuda(0), n * sizeof(T)))) {}
  DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    copy_bytes(ptr, Device::cuda(0), host.data(), Device::cpu(), n * sizeof(T));
  }
  ~DeviceBuffer() { device_free(Device::cuda(0), ptr, n * sizeof(T)); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

bool same_bits(float a, float b) { return kernels::float_bits(a) == kernels::float_bits(b); }

// 16-bit words equal, except that any NaN matches any NaN: a NaN's payload after x * scale is
// the hardware's choice (x86 keeps the operand's, NVIDIA GPUs return a canonical NaN).
bool same_half(uint16_t gpu, uint16_t cpu, bool bf16) {
  auto is_nan = [bf16](uint16_t h) {
    return bf16 ? ((h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0) : ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0);
  };
  return gpu == cpu || (is_nan(gpu) && is_nan(cpu));
}

bool same_float(float gpu, float cpu) { return same_bits(gpu, cpu) || (std::isnan(gpu) && std::isnan(cpu)); }

using GpuKernels = GpuTest;

TEST_F(GpuKernels, FillAndScaleMatchTheCpuBitForBit) {
  std::vector<float> x = tricky_values();
  DeviceBuffer<float> d(x);
  launch(gpu(), static_cast<int64_t>(x.size()), kernels::Scale{d.ptr, -0.37f});
  std::vector<float> cpu = x;
  launch(Device::cpu(), static_cast<int64_t>(cpu.size()), kernels::Scale{cpu.data(), -0.37f});
  std::vector<float> got = download<float>(d.ptr, x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_TRUE(same_float(got[i], cpu[i]))
        << "Scale of " << x[i] << ": gpu " << got[i] << " cpu " << cpu[i];
  }
  launch(gpu(), static_cast<int64_t>(x.size()), kernels::Fill{d.ptr, 2.5f});
  for (float v : download<float>(d.ptr, x.size())) ASSERT_EQ(v, 2.5f);
}

TEST_F(GpuKernels, AxpyMatchesTheCpuWithinOneRounding) {
  const int n = 10007;  // not a multiple of the block size
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = std::sin(0.1f * i) * 100.0f;
    y[i] = std::cos(0.3f * i);
  }
  DeviceBuffer<float> dx(x), dy(y);
  // 0.3 is inexact, so alpha * x rounds: the case where a fused multiply-add differs.
  launch(gpu(), n, kernels::Axpy{dy.ptr, dx.ptr, 0.3f});
  launch(Device::cpu(), n, kernels::Axpy{y.data(), x.data(), 0.3f});
  std::vector<float> got = download<float>(dy.ptr, n);
  // nvcc contracts y + a*x into one FMA (one rounding instead of two): allow 2 ulp of the result.
  for (int i = 0; i < n; ++i) {
    const float tol = 2 * std::numeric_limits<float>::epsilon() * std::max(std::fabs(y[i]), std::fabs(0.3f * x[i]));
    ASSERT_NEAR(got[i], y[i], tol) << "i=" << i;
  }
}

TEST_F(GpuKernels, Bf16AndFp16PackUnpackMatchTheCpuBitForBit) {
  const std::vector<float> x = tricky_values();
  const size_t n = x.size();
  DeviceBuffer<float> dx(x), dy(n);
  DeviceBuffer<uint16_t> packed(n);
  for (const float scale : {1.0f, 0.125f}) {
    std::vector<uint16_t> cpu_bf16(n), cpu_fp16(n);
    std::vector<float> cpu_back(n);
    launch(Device::cpu(), static_cast<int64_t>(n), kernels::PackBF16{cpu_bf16.data(), x.data(), scale});
    launch(gpu(), static_cast<int64_t>(n), kernels::PackBF16{packed.ptr, dx.ptr, scale});
    std::vector<uint16_t> words = download<uint16_t>(packed.ptr, n);
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(same_half(words[i], cpu_bf16[i], true)) << "bf16 pack of " << x[i];
    launch(Device::cpu(), static_cast<int64_t>(n), kernels::UnpackBF16{cpu_back.data(), cpu_bf16.data()});
    launch(gpu(), static_cast<int64_t>(n), kernels::UnpackBF16{dy.ptr, packed.ptr});
    std::vector<float> got = download<float>(dy.ptr, n);
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(same_float(got[i], cpu_back[i])) << "bf16 unpack of " << x[i];

    launch(Device::cpu(), static_cast<int64_t>(n), kernels::PackFP16{cpu_fp16.data(), x.data(), scale});
    launch(gpu(), static_cast<int64_t>(n), kernels::PackFP16{packed.ptr, dx.ptr, scale});
    words = download<uint16_t>(packed.ptr, n);
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(same_half(words[i], cpu_fp16[i], false)) << "fp16 pack of " << x[i];
    launch(Device::cpu(), static_cast<int64_t>(n), kernels::UnpackFP16{cpu_back.data(), cpu_fp16.data()});
    launch(gpu(), static_cast<int64_t>(n), kernels::UnpackFP16{dy.ptr, packed.ptr});
    got = download<float>(dy.ptr, n);
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(same_float(got[i], cpu_back[i])) << "fp16 unpack of " << x[i];
  }
}

TEST_F(GpuKernels, GridStrideCoversMoreElementsThanTheGridHasThreads) {
  // The grid is capped at 65535*4 blocks of 256 threads (67,107,840); go past it so threads loop.
  const int64_t n = (int64_t{1} << 26) + 4099;
  Tensor t = Tensor::zeros({n}, gpu());
  fill(t, 3.0f);
  std::vector<float> host = t.to_vector();
  int64_t wrong = 0;
  for (float v : host) wrong += (v != 3.0f);
  EXPECT_EQ(wrong, 0);
}

TEST_F(GpuKernels, TensorOpsRunOnTheGpu) {
  Tensor y = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {4}, gpu());
  Tensor x = Tensor::from_vector(std::vector<float>{10, 20, 30, 40}, {4}, gpu());
  axpy(y, x, 0.5f);  // 6, 12, 18, 24
  scale(y, 2.0f);    // 12, 24, 36, 48
  EXPECT_EQ(y.to_vector(), (std::vector<float>{12, 24, 36, 48}));
}

}  // namespace
}  // namespace dtrain
