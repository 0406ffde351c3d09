// Device requests and per-rank device selection (see device_select.h).
#include "core/device_select.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>

#include <fmt/format.h>

#include "core/error.h"
#include "core/gpu_backend.h"

namespace dtrain {

namespace {

// Why there is no GPU, for logs and errors.
std::string no_gpu_detail(const DeviceInventory& inv) {
  if (!inv.cuda_build) return "this dtrain binary was built without CUDA";
  std::string detail = fmt::format("CUDA_VISIBLE_DEVICES={}", inv.visible_env);
  if (!inv.count_error.empty()) detail += "; " + inv.count_error;
  return detail;
}

DeviceChoice cuda_choice(int index, int local_rank, int local_size, const DeviceInventory& inv) {
  return {Device::cuda(index), fmt::format("using cuda:{} (local rank {} of {}; CUDA_VISIBLE_DEVICES={})", index,
                                           local_rank, local_size, inv.visible_env)};
}

}  // namespace

std::optional<DeviceRequest> DeviceRequest::parse(const std::string& text) {
  if (text == "auto") return automatic();
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda();
  constexpr std::string_view prefix = "cuda:";
  if (text.size() > prefix.size() && text.starts_with(prefix)) {
    const char* first = text.data() + prefix.size();
    const char* last = text.data() + text.size();
    int index = -1;
    auto [end, ec] = std::from_chars(first, last, index);
    // Digits only: from_chars accepts a leading '-', which is not a device.
    if (ec == std::errc() && end == last && *first != '-' && *first != '+') return cuda(index);
  }
  return std::nullopt;
}

std::string DeviceRequest::str() const {
  switch (kind) {
    case Kind::kAuto: return "auto";
    case Kind::kCpu: return "cpu";
    case Kind::kCuda: return "cuda";
    case Kind::kCudaIndex: return fmt::format("cuda:{}", index);
  }
  return "?";
}

DeviceInventory probe_devices() {
  DeviceInventory inv;
  inv.cuda_build = gpu_backend_available();
  const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
  inv.visible_env = env ? env : "<unset>";
  if (!inv.cuda_build) return inv;
  // No driver, no device: the backend (cudart, cuBLAS, NCCL) stays unopened (Note [Loaded on use]).
  if (!gpu_driver_present()) {
    inv.count_error = "no NVIDIA driver (/dev/nvidiactl and /proc/driver/nvidia are missing)";
    return inv;
  }
  inv.count = gpu_backend().device_count();
  if (inv.count == 0) inv.count_error = gpu_backend().device_count_error();
  return inv;
}

DeviceChoice choose_device(const DeviceRequest& request, int local_rank, int local_size, bool allow_gpu_sharing,
                           const DeviceInventory& inv) {
  using Kind = DeviceRequest::Kind;
  DTRAIN_CHECK(local_rank >= 0 && local_rank < local_size, "local rank {} of {}", local_rank, local_size);
  const std::string what = request.str();
  if (request.kind == Kind::kCpu) return {Device::cpu(), "using cpu (requested)"};
  if (inv.count == 0) {
    if (request.kind == Kind::kAuto)
      return {Device::cpu(), fmt::format("no CUDA device visible; using CPU ({})", no_gpu_detail(inv))};
    // No GPU visible may be this node's (1: a restart elsewhere may fix it); a binary without
    // CUDA fails every time (2).
    if (!inv.cuda_build) throw Error(fmt::format("device {}: {}", what, no_gpu_detail(inv)), ErrorKind::kUsage);
    throw Error(fmt::format("device {}: no CUDA device visible ({})", what, no_gpu_detail(inv)));
  }
  // Note [Per-task visible GPUs]: the ranks check afterwards that each saw a different device.
  const bool one_visible = inv.count == 1 && (request.kind != Kind::kCudaIndex || request.index == 0);
  if (one_visible && local_size > 1 && !allow_gpu_sharing) {
    DeviceChoice choice = cuda_choice(0, local_rank, local_size, inv);
    choice.log_line.insert(choice.log_line.size() - 1, "; one visible GPU per rank");
    return choice;
  }
  if (request.kind == Kind::kCudaIndex) {
    if (request.index >= inv.count) {
      throw Error(fmt::format("device {}: only {} CUDA device{} visible (CUDA_VISIBLE_DEVICES={})", what, inv.count,
                              inv.count == 1 ? "" : "s", inv.visible_env));
    }
    if (local_size > 1 && !allow_gpu_sharing) {
      throw Error(fmt::format("device {} puts all {} local ranks on one GPU; request device cuda for one GPU per "
                              "rank, or allow GPU sharing",
                              what, local_size));
    }
    return cuda_choice(request.index, local_rank, local_size, inv);
  }
  // auto with devices, or cuda: one device per local rank.
  if (local_size > inv.count && !allow_gpu_sharing) {
    throw Error(fmt::format("{} local ranks but only {} visible GPU{} (CUDA_VISIBLE_DEVICES={}); allow GPU sharing to "
                            "map local rank r to visible GPU r mod {} (also when each rank's own "
                            "CUDA_VISIBLE_DEVICES names a different GPU)",
                            local_size, inv.count, inv.count == 1 ? "" : "s", inv.visible_env, inv.count));
  }
  return cuda_choice(local_rank % inv.count, local_rank, local_size, inv);
}

std::string shared_gpu_error(const std::vector<std::string>& ids, int rank) {
  const std::string& mine = ids.at(static_cast<size_t>(rank));
  for (size_t r = 0; r < ids.size(); ++r) {
    if (static_cast<int>(r) != rank && ids[r] == mine)
      return fmt::format("ranks {} and {} share GPU {}; NCCL needs one GPU per rank (run at most as many ranks per "
                         "node as GPUs)",
                         std::min(static_cast<int>(r), rank), std::max(static_cast<int>(r), rank), mine);
  }
  return "";
}

DeviceChoice select_device(const DeviceRequest& request, int local_rank, int local_size, bool allow_gpu_sharing) {
  DeviceChoice choice = choose_device(request, local_rank, local_size, allow_gpu_sharing, probe_devices());
  if (choice.device.is_cuda()) {
    gpu_backend().set_device(choice.device.index);
    choice.log_line.pop_back();  // the closing parenthesis
    choice.log_line += fmt::format("; PCI {})", gpu_backend().pci_bus_id(choice.device.index));
  }
  return choice;
}

}  // namespace dtrain
