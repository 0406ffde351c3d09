// Device selection: a DeviceRequest (auto | cpu | cuda | cuda:N) and this process's place on its
// node become a Device, the process is pinned to it (cudaSetDevice), and one log line explains
// the choice. choose_device() is the pure decision, so it is tested without GPUs.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/device.h"

namespace dtrain {

struct DeviceRequest {
  enum class Kind { kAuto, kCpu, kCuda, kCudaIndex };
  Kind kind = Kind::kAuto;
  int index = 0;  // kCudaIndex: a logical index into CUDA_VISIBLE_DEVICES

  static DeviceRequest automatic() { return {Kind::kAuto, 0}; }
  static DeviceRequest cpu() { return {Kind::kCpu, 0}; }
  static DeviceRequest cuda() { return {Kind::kCuda, 0}; }
  static DeviceRequest cuda(int index) { return {Kind::kCudaIndex, index}; }
  // "auto", "cpu", "cuda" or "cuda:N" (N decimal digits); nullopt for anything else.
  static std::optional<DeviceRequest> parse(const std::string& text);
  std::string str() const;
  friend bool operator==(const DeviceRequest&, const DeviceRequest&) = default;
};

struct DeviceChoice {
  Device device;
  std::string log_line;  // e.g. "using cuda:1 (local rank 1 of 4; CUDA_VISIBLE_DEVICES=<unset>; PCI 0000:3b:00.0)"
};

// What this process can see.
struct DeviceInventory {
  bool cuda_build = false;   // the CUDA backend is available to this binary
  int count = 0;             // visible CUDA devices
  std::string visible_env;   // CUDA_VISIBLE_DEVICES, or "<unset>"
  std::string count_error;   // why count is 0 (cudaGetDeviceCount's error), may be empty
};
DeviceInventory probe_devices();

// The decision alone: no CUDA calls, no PCI id in the log line. Throws Error for a request
// this inventory cannot satisfy.
//   cpu      -> cpu
//   auto     -> as cuda when a device is visible, else cpu ("no CUDA device visible; using CPU")
//   cuda     -> logical device local_rank; more local ranks than devices is an error unless
//               allow_gpu_sharing, which maps local_rank % count
//   cuda:N   -> device N for every local rank (several local ranks need allow_gpu_sharing)
// Except: a rank that sees exactly one device takes it (cuda, auto, cuda:0) whatever its local
// rank. Note [Per-task visible GPUs].
DeviceChoice choose_device(const DeviceRequest& request, int local_rank, int local_size, bool allow_gpu_sharing,
                           const DeviceInventory& inventory);

// Note [Per-task visible GPUs]: under Slurm's --gpus-per-task (or a CUDA_VISIBLE_DEVICES set
// per rank) every rank sees one device, logical 0, and local ranks 1, 2, ... have no device of
// their number. From its own inventory a rank cannot tell that case (each sees a different GPU:
// fine) from ranks that all see the same one (sharing: NCCL fails or hangs at init). So
// choose_device takes the one visible device, and the ranks then compare "host/PCI bus id"
// (shared_gpu_error, on what comm/runtime.cpp exchanges): the same GPU on two ranks stays an
// error, flag or not, since NCCL needs one GPU per rank.

// `ids[r]` is rank r's "host/PCI bus id": one line naming the first two ranks (lowest first)
// that share a GPU, from `rank`'s side ("" when `rank` shares its GPU with no one). Pure.
std::string shared_gpu_error(const std::vector<std::string>& ids, int rank);

// probe_devices() + choose_device() + pinning the process to the device, its PCI bus id
// appended to the log line.
DeviceChoice select_device(const DeviceRequest& request, int local_rank, int local_size, bool allow_gpu_sharing);

}  // namespace dtrain
