// The GPU backend's registration point (see gpu_backend.h, Note [GPU plugins without a cycle]):
// core finds the plugin's path and calls the loader comm installed; it never opens a library.
#include "core/gpu_backend.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include <fmt/format.h>

#include "core/error.h"
#include "core/launch.h"

namespace dtrain {

namespace {

// A plain pointer, constant-initialised: comm's static initialiser may set it before any of
// core's dynamic initialisers would have run.
std::atomic<GpuBackendLoader> g_loader{nullptr};

}  // namespace

std::string gpu_plugin_path(const char* library) {
  if (std::string_view(library) == kGpuBackendLibrary)
    if (const char* env = std::getenv("DTRAIN_CUDA_BACKEND"); env && *env) return env;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&gpu_backend_available), &info) == 0 || !info.dli_fname) return library;
  return (std::filesystem::path(info.dli_fname).parent_path() / library).string();
}

bool gpu_backend_available() {
  std::error_code ec;
  return std::filesystem::exists(gpu_plugin_path(kGpuBackendLibrary), ec);
}

bool gpu_driver_present() {
  std::error_code ec;
  return std::filesystem::exists("/dev/nvidiactl", ec) || std::filesystem::exists("/proc/driver/nvidia", ec);
}

void set_gpu_backend_loader(GpuBackendLoader loader) { g_loader.store(loader, std::memory_order_release); }

GpuBackend& gpu_backend() {
  static GpuBackend* backend = nullptr;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string path = gpu_plugin_path(kGpuBackendLibrary);
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      error = fmt::format("this dtrain was built without its CUDA backend ({} not found)", path);
      return;
    }
    const GpuBackendLoader loader = g_loader.load(std::memory_order_acquire);
    if (!loader) {
      error = fmt::format("no loader for the CUDA backend {} (libdtrain_comm installs it: call dtrain::init() or "
                          "dtrain::install_gpu_backend_loader())",
                          path);
      return;
    }
    try {
      backend = &loader();
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  if (!backend) throw Error(error);
  return *backend;
}

void launch_on_gpu(const std::type_info& kernel, int64_t n, const void* functor) {
  gpu_backend().launch(kernel, n, functor);
}

}  // namespace dtrain
