// Device: where a tensor lives and where its kernels run (CPU or CUDA:N, N a logical index
// into CUDA_VISIBLE_DEVICES). Parsing of the --device flag lives here; selecting a device
// (auto -> cuda or cpu, set-device per local rank) lives in core/device_select.h.
#pragma once

#include <string>

namespace dtrain {

enum class DeviceType { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;

  static Device cpu() { return {DeviceType::kCPU, 0}; }
  static Device cuda(int index) { return {DeviceType::kCUDA, index}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  std::string str() const;
  friend bool operator==(const Device&, const Device&) = default;
};

}  // namespace dtrain
