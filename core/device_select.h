// select_device(): turns the --device flag (auto | cpu | cuda | cuda:N) and this process's
// place on its node into a Device, pins the process to it (cudaSetDevice), and explains the
// choice in one log line. choose_device() is the pure decision, so it is tested without GPUs.
#pragma once

#include <string>

#include "core/device.h"

namespace dtrain {

struct DeviceChoice {
  Device device;
  std::string log_line;  // e.g. "using cuda:1 (local rank 1 of 4; CUDA_VISIBLE_DEVICES=<unset>; PCI 0000:3b:00.0)"
};

// What this process can see.
struct DeviceInventory {
  bool cuda_build = built_with_cuda();
  int count = 0;             // visible CUDA devices
  std::string visible_env;   // CUDA_VISIBLE_DEVICES, or "<unset>"
  std::string count_error;   // why count is 0 (cudaGetDeviceCount's error), may be empty
};
DeviceInventory probe_devices();

// The decision alone: no CUDA calls, no PCI id in the log line. Throws UsageError for a
// malformed flag and Error for a flag this inventory cannot satisfy.
//   cpu      -> cpu
//   auto     -> as cuda when a device is visible, else cpu ("no CUDA device visible; using CPU")
//   cuda     -> logical device local_rank; more local ranks than devices is an error unless
//               allow_gpu_sharing, which maps local_rank % count
//   cuda:N   -> device N for every local rank (several local ranks need allow_gpu_sharing)
DeviceChoice choose_device(const std::string& flag, int local_rank, int local_size, bool allow_gpu_sharing,
                           const DeviceInventory& inventory);

// probe_devices() + choose_device() + cuda::set_device(), the PCI bus id appended to the log.
DeviceChoice select_device(const std::string& flag, int local_rank, int local_size, bool allow_gpu_sharing);

}  // namespace dtrain
