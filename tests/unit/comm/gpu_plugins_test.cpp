// The GPU plugins' loader (comm/gpu_plugins.h): a plugin of another API version is refused with
// one line naming the library and both versions, one of this version loads, and core's
// registration point reaches the loader (Note [GPU plugins without a cycle]), and what the
// Runtime hands the NCCL plugin (comm/nccl_options.h) reaches it: SIGUSR1's dump requests and the
// device-timing choice. The plugins are tiny fakes (tests/unit/comm/plugins), so this runs in CPU
// builds (the real NCCL plugin's side runs in tests/gpu only). Each case runs in a process of its
// own (gtest_discover_tests), so core's load-once state starts fresh in each.
#include "comm/gpu_plugins.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "comm/flight_recorder.h"
#include "comm/nccl/nccl_plugin.h"
#include "comm/nccl_options.h"
#include "comm/self_communicator.h"
#include "core/error.h"
#include "core/gpu_backend.h"

namespace dtrain {
namespace {

const std::string kRight = DTRAIN_FAKE_PLUGIN_RIGHT;  // built with kGpuBackendApiVersion
const std::string kWrong = DTRAIN_FAKE_PLUGIN_WRONG;  // built with kGpuBackendApiVersion + 1
const std::string kFakeNccl = DTRAIN_FAKE_NCCL_PLUGIN;  // a libdtrain_nccl.so without NCCL, not linked to comm

std::string load_error(const std::string& path, const char* entry = kGpuBackendEntryPoint) {
  try {
    open_plugin(path, entry, kGpuBackendApiVersion);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(GpuPlugins, AnotherApiVersionIsRefusedNamingTheLibraryAndBothVersions) {
  const std::string error = load_error(kWrong);
  EXPECT_EQ(error, fmt::format("{}: plugin API version {}, this dtrain expects {} (a library from another dtrain build)",
                               kWrong, kGpuBackendApiVersion + 1, kGpuBackendApiVersion));
}

TEST(GpuPlugins, ThisApiVersionLoads) {
  const auto* plugin = static_cast<const GpuBackendPlugin*>(
      open_plugin(kRight, kGpuBackendEntryPoint, kGpuBackendApiVersion));
  ASSERT_NE(plugin, nullptr);
  EXPECT_EQ(plugin->api_version, kGpuBackendApiVersion);
  EXPECT_EQ(plugin->backend, nullptr);  // the fake's
  EXPECT_EQ(open_plugin(kRight, kGpuBackendEntryPoint, kGpuBackendApiVersion), plugin) << "loaded once";
}

TEST(GpuPlugins, MissingLibraryOrEntryPointIsOneLine) {
  const std::string missing = load_error("/nonexistent/libdtrain_cuda.so");
  EXPECT_EQ(missing.rfind("cannot load the plugin /nonexistent/libdtrain_cuda.so: ", 0), 0u) << missing;
  EXPECT_EQ(load_error(kRight, "dtrain_no_such_entry"),
            fmt::format("{} has no entry point dtrain_no_such_entry (a library of another dtrain version?)", kRight));
}

TEST(GpuPlugins, CoreReachesTheLoaderAndSaysWhyTheBackendIsRefused) {
  // DTRAIN_CUDA_BACKEND points core at the wrong-version fake: gpu_backend() goes through the
  // loader comm installed, and the version check's line is what the user sees.
  ASSERT_EQ(setenv("DTRAIN_CUDA_BACKEND", kWrong.c_str(), 1), 0);
  EXPECT_TRUE(gpu_backend_available());
  try {
    gpu_backend();
    FAIL() << "a plugin of another version was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("plugin API version {}, this dtrain expects {}",
                                                     kGpuBackendApiVersion + 1, kGpuBackendApiVersion)),
              std::string::npos)
        << e.what();
  }
  unsetenv("DTRAIN_CUDA_BACKEND");
}

// The options the Runtime passes the NCCL plugin: timing events only when asked for (--trace,
// --metrics), and with a recorder, a dump and comm's request counter (the plugin cannot link it).
TEST(NcclPluginOptions, DeviceTimingAndDumpsAsTheRuntimeAsks) {
  RuntimeOptions runtime;
  EXPECT_FALSE(runtime_nccl_options(runtime, nullptr, nullptr, 0, 2).device_timing);
  runtime.device_timing = true;
  EXPECT_TRUE(runtime_nccl_options(runtime, nullptr, nullptr, 0, 2).device_timing);

  const NcclOptions unrecorded = runtime_nccl_options(runtime, nullptr, nullptr, 0, 2);
  EXPECT_EQ(unrecorded.log, nullptr);
  EXPECT_EQ(unrecorded.dump_requests, nullptr) << "nothing to dump";
  FlightRecorder recorder(16, "nccl");
  const NcclOptions recorded = runtime_nccl_options(runtime, nullptr, &recorder, 0, 2);
  EXPECT_EQ(recorded.log, &recorder);
  ASSERT_NE(recorded.dump_requests, nullptr);
  const uint64_t before = recorded.dump_requests();
  request_flight_recorder_dump();
  EXPECT_EQ(recorded.dump_requests(), before + 1) << "the hook reads comm's SIGUSR1 counter";
}

// SIGUSR1 reaches the NCCL plugin's recorder: a plugin that does not link comm sees comm's dump
// requests through its entry point and writes flight_recorder_rank<R>_nccl.json, once per
// request and not before one; the run goes on.
TEST(GpuPlugins, TheNcclPluginWritesItsRecorderOnSigusr1) {
  const auto* plugin =
      static_cast<const NcclPlugin*>(open_plugin(kFakeNccl, kNcclPluginEntryPoint, kNcclPluginApiVersion));
  const std::filesystem::path dir = std::filesystem::path(testing::TempDir()) / "nccl_sigusr1";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  RuntimeOptions runtime;
  runtime.flight_recorder_dir = dir.string();
  FlightRecorder recorder(16, "nccl");
  SelfCommunicator bootstrap;
  std::unique_ptr<Communicator> nccl(plugin->make_communicator(
      bootstrap, Device::cpu(), runtime_nccl_options(runtime, nullptr, &recorder, 0, 1)));
  nccl->allreduce_async(nullptr, 1000, DType::kF32, ReduceOp::kSum)->wait();

  const std::filesystem::path dump = FlightRecorder::dump_path(dir.string(), 0, "nccl");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // 50 polls of the plugin's thread
  EXPECT_FALSE(std::filesystem::exists(dump)) << "written with no request";
  request_flight_recorder_dump();  // what the SIGUSR1 handler does (app/preemption.cpp)
  for (int i = 0; i < 500 && !std::filesystem::exists(dump); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(std::filesystem::exists(dump)) << "no " << dump << " 5 s after the request";
  std::ostringstream text;
  text << std::ifstream(dump).rdbuf();
  EXPECT_NE(text.str().find("SIGUSR1"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("allreduce"), std::string::npos) << text.str();
  std::filesystem::remove(dump);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(std::filesystem::exists(dump)) << "one request, two dumps";
  nccl->barrier_async()->wait();  // the run goes on
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dtrain
