// The GPU plugins' loader (comm/gpu_plugins.h): a plugin of another API version is refused with
// one line naming the library and both versions, one of this version loads, and core's
// registration point reaches the loader (Note [GPU plugins without a cycle]). The plugins are
// tiny fakes (tests/unit/comm/plugins), so this runs in CPU builds. Each case runs in a process
// of its own (gtest_discover_tests), so core's load-once state starts fresh in each.
#include "comm/gpu_plugins.h"

#include <cstdlib>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/gpu_backend.h"

namespace dtrain {
namespace {

const std::string kRight = DTRAIN_FAKE_PLUGIN_RIGHT;  // built with kGpuBackendApiVersion
const std::string kWrong = DTRAIN_FAKE_PLUGIN_WRONG;  // built with kGpuBackendApiVersion + 1

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

}  // namespace
}  // namespace dtrain
