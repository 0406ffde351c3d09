// Device requests and per-rank device choice (core/device_select.h), with faked inventories
// so the GPU rules are checked on machines without GPUs.
#include "core/device_select.h"

#include <gtest/gtest.h>

#include <optional>
#include <stdexcept>

#include "core/error.h"

namespace dtrain {
namespace {

DeviceInventory no_gpus() {
  DeviceInventory inv;
  inv.cuda_build = true;
  inv.count = 0;
  inv.visible_env = "<unset>";
  inv.count_error = "cudaGetDeviceCount: no CUDA-capable device is detected";
  return inv;
}

DeviceInventory gpus(int n, std::string env = "<unset>") {
  DeviceInventory inv;
  inv.cuda_build = true;
  inv.count = n;
  inv.visible_env = std::move(env);
  return inv;
}

DeviceRequest req(const std::string& text) {
  std::optional<DeviceRequest> r = DeviceRequest::parse(text);
  if (!r) throw std::invalid_argument("test uses a malformed request: " + text);
  return *r;
}

DeviceChoice choose_device(const std::string& text, int local_rank, int local_size, bool sharing,
                           const DeviceInventory& inv) {
  return dtrain::choose_device(req(text), local_rank, local_size, sharing, inv);
}

std::string error_of(const std::string& text, int local_rank, int local_size, bool sharing,
                     const DeviceInventory& inv) {
  try {
    choose_device(text, local_rank, local_size, sharing, inv);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DeviceSelect, ParsesRequestsAndRejectsMalformedOnes) {
  for (const char* bad : {"", "gpu", "CUDA", "cuda:", "cuda:-1", "cuda:+1", "cuda:1x", "cuda:x", "cpu:0",
                          "cuda:99999999999"}) {
    EXPECT_FALSE(DeviceRequest::parse(bad).has_value()) << bad;
  }
  EXPECT_EQ(DeviceRequest::parse("auto"), DeviceRequest::automatic());
  EXPECT_EQ(DeviceRequest::parse("cpu"), DeviceRequest::cpu());
  EXPECT_EQ(DeviceRequest::parse("cuda"), DeviceRequest::cuda());
  EXPECT_EQ(DeviceRequest::parse("cuda:3"), DeviceRequest::cuda(3));
  for (const char* text : {"auto", "cpu", "cuda", "cuda:0", "cuda:12"}) EXPECT_EQ(req(text).str(), text);
}

TEST(DeviceSelect, CpuIsAlwaysCpu) {
  EXPECT_EQ(choose_device("cpu", 0, 1, false, gpus(8)).device, Device::cpu());
  EXPECT_EQ(choose_device("cpu", 3, 4, false, no_gpus()).device, Device::cpu());
}

TEST(DeviceSelect, AutoFallsBackToCpuWithoutGpuAndSaysWhy) {
  DeviceChoice c = choose_device("auto", 0, 2, false, no_gpus());
  EXPECT_EQ(c.device, Device::cpu());
  EXPECT_NE(c.log_line.find("no CUDA device visible; using CPU"), std::string::npos) << c.log_line;
  EXPECT_NE(c.log_line.find("no CUDA-capable device is detected"), std::string::npos) << c.log_line;

  DeviceInventory cpu_build;
  cpu_build.cuda_build = false;
  c = choose_device("auto", 0, 1, false, cpu_build);
  EXPECT_EQ(c.device, Device::cpu());
  EXPECT_NE(c.log_line.find("built without CUDA"), std::string::npos) << c.log_line;
}

TEST(DeviceSelect, AutoPicksOneGpuPerLocalRankWhenGpusAreVisible) {
  EXPECT_EQ(choose_device("auto", 0, 2, false, gpus(2)).device, Device::cuda(0));
  EXPECT_EQ(choose_device("auto", 1, 2, false, gpus(2)).device, Device::cuda(1));
}

TEST(DeviceSelect, CudaWithoutGpuIsAClearError) {
  std::string msg = error_of("cuda", 0, 1, false, no_gpus());
  EXPECT_NE(msg.find("device cuda: no CUDA device visible"), std::string::npos) << msg;
  EXPECT_NE(msg.find("CUDA_VISIBLE_DEVICES=<unset>"), std::string::npos) << msg;
  msg = error_of("cuda:0", 0, 1, false, no_gpus());
  EXPECT_NE(msg.find("device cuda:0: no CUDA device visible"), std::string::npos) << msg;

  DeviceInventory cpu_build;
  cpu_build.cuda_build = false;
  msg = error_of("cuda", 0, 1, false, cpu_build);
  EXPECT_EQ(msg, "device cuda: this dtrain binary was built without CUDA");
  // A CPU-only binary refuses --device cuda on every node: a usage error (2), not one a restart
  // may fix (1), which no visible GPU stays.
  const auto kind_of = [](const DeviceInventory& inv) {
    try {
      choose_device("cuda", 0, 1, false, inv);
    } catch (const Error& e) {
      return e.kind();
    }
    return ErrorKind::kDiverged;  // no error: neither kind below
  };
  EXPECT_EQ(kind_of(cpu_build), ErrorKind::kUsage);
  EXPECT_EQ(kind_of(no_gpus()), ErrorKind::kFailure);
}

TEST(DeviceSelect, CudaMapsLocalRankToLogicalDevice) {
  for (int r = 0; r < 4; ++r) {
    DeviceChoice c = choose_device("cuda", r, 4, false, gpus(4, "4,5,6,7"));
    EXPECT_EQ(c.device, Device::cuda(r));
    EXPECT_NE(c.log_line.find(fmt::format("cuda:{}", r)), std::string::npos) << c.log_line;
    EXPECT_NE(c.log_line.find("CUDA_VISIBLE_DEVICES=4,5,6,7"), std::string::npos) << c.log_line;
  }
  // Fewer ranks than GPUs is fine: the extra GPUs stay idle.
  EXPECT_EQ(choose_device("cuda", 1, 2, false, gpus(8)).device, Device::cuda(1));
}

TEST(DeviceSelect, MoreLocalRanksThanGpusNeedsSharing) {
  std::string msg = error_of("cuda", 0, 4, false, gpus(2, "0,1"));
  EXPECT_EQ(msg, "4 local ranks but only 2 visible GPUs (CUDA_VISIBLE_DEVICES=0,1); allow GPU sharing to map "
                 "local rank r to visible GPU r mod 2 (also when each rank's own CUDA_VISIBLE_DEVICES names a "
                 "different GPU)");
  EXPECT_FALSE(error_of("auto", 3, 4, false, gpus(2)).empty());
  // With sharing, ranks wrap around the visible devices.
  EXPECT_EQ(choose_device("cuda", 2, 4, true, gpus(2)).device, Device::cuda(0));
  EXPECT_EQ(choose_device("cuda", 3, 4, true, gpus(2)).device, Device::cuda(1));
}

TEST(DeviceSelect, ExplicitIndexIsCheckedAgainstVisibleDevices) {
  EXPECT_EQ(choose_device("cuda:1", 0, 1, false, gpus(2)).device, Device::cuda(1));
  std::string msg = error_of("cuda:2", 0, 1, false, gpus(2, "0,1"));
  EXPECT_EQ(msg, "device cuda:2: only 2 CUDA devices visible (CUDA_VISIBLE_DEVICES=0,1)");
  // Several local ranks on one explicit GPU only with sharing.
  EXPECT_FALSE(error_of("cuda:0", 1, 2, false, gpus(2)).empty());
  EXPECT_EQ(choose_device("cuda:0", 1, 2, true, gpus(2)).device, Device::cuda(0));
}

// Note [Per-task visible GPUs]: srun --gpus-per-task shows every rank one GPU, its logical 0.
TEST(DeviceSelect, OneVisibleGpuPerRankNeedsNoSharingFlag) {
  for (const char* request : {"cuda", "auto", "cuda:0"}) {
    for (int r = 0; r < 4; ++r) {
      const DeviceChoice c = choose_device(request, r, 4, false, gpus(1, std::to_string(r)));
      EXPECT_EQ(c.device, Device::cuda(0)) << request << " local rank " << r;
      EXPECT_EQ(c.log_line, fmt::format("using cuda:0 (local rank {} of 4; CUDA_VISIBLE_DEVICES={}; one visible GPU "
                                        "per rank)",
                                        r, r));
    }
  }
  // A device the rank does not see is still an error.
  EXPECT_EQ(error_of("cuda:1", 1, 2, false, gpus(1, "1")), "device cuda:1: only 1 CUDA device visible (CUDA_VISIBLE_DEVICES=1)");
}

// Whether they see different GPUs is the ranks' exchange of "host/PCI bus id" to decide.
TEST(DeviceSelect, RanksThatShareOneGpuAreNamed) {
  const std::vector<std::string> per_task = {"n1/0000:3b:00.0", "n1/0000:5e:00.0", "n2/0000:3b:00.0"};
  for (int r = 0; r < 3; ++r) EXPECT_EQ(shared_gpu_error(per_task, r), "") << r;
  const std::vector<std::string> shared = {"n1/0000:3b:00.0", "n1/0000:5e:00.0", "n1/0000:3b:00.0"};
  EXPECT_EQ(shared_gpu_error(shared, 2),
            "ranks 0 and 2 share GPU n1/0000:3b:00.0; NCCL needs one GPU per rank (run at most as many ranks per node "
            "as GPUs)");
  EXPECT_EQ(shared_gpu_error(shared, 0), shared_gpu_error(shared, 2));
  EXPECT_EQ(shared_gpu_error(shared, 1), "");
  EXPECT_EQ(shared_gpu_error({"n1/0000:3b:00.0"}, 0), "");
}

TEST(DeviceSelect, SelectOnThisMachineAgreesWithTheInventory) {
  // Whatever this machine has: auto never fails, and picks CUDA exactly when devices are visible.
  const DeviceInventory inv = probe_devices();
  DeviceChoice c = select_device(DeviceRequest::automatic(), 0, 1, false);
  EXPECT_EQ(c.device.is_cuda(), inv.count > 0) << c.log_line;
  if (inv.count == 0) {
    EXPECT_THROW(select_device(DeviceRequest::cuda(), 0, 1, false), Error);
  }
}

}  // namespace
}  // namespace dtrain
