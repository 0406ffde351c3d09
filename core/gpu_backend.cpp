// Finding and opening the GPU backend library (see gpu_backend.h, Note [Loaded on use]).
#include "core/gpu_backend.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include <fmt/format.h>

#include "core/error.h"
#include "core/launch.h"

namespace dtrain {

namespace {

constexpr const char* kLibraryName = "libdtrain_cuda.so";
constexpr const char* kEntryPoint = "dtrain_gpu_backend_v1";

// The backend library: DTRAIN_CUDA_BACKEND, else libdtrain_cuda.so in this library's folder
// (the build tree and installs put every dtrain library in one folder).
std::filesystem::path library_path() {
  if (const char* env = std::getenv("DTRAIN_CUDA_BACKEND"); env && *env) return env;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&gpu_backend_available), &info) == 0 || !info.dli_fname) return kLibraryName;
  return std::filesystem::path(info.dli_fname).parent_path() / kLibraryName;
}

struct Loaded {
  void* handle = nullptr;
  GpuBackend* backend = nullptr;
};

const Loaded& load() {
  static Loaded loaded;
  static std::once_flag once;
  static std::string error;
  std::call_once(once, [] {
    const std::filesystem::path path = library_path();
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      error = fmt::format("this dtrain was built without its CUDA backend ({} not found)", path.string());
      return;
    }
    loaded.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!loaded.handle) {
      error = fmt::format("cannot load the CUDA backend {}: {}", path.string(), dlerror());
      return;
    }
    using Entry = GpuBackend* (*)();
    auto entry = reinterpret_cast<Entry>(dlsym(loaded.handle, kEntryPoint));
    if (!entry) {
      error = fmt::format("{} has no {} (a library of another dtrain version?)", path.string(), kEntryPoint);
      return;
    }
    loaded.backend = entry();
  });
  if (!loaded.backend) throw Error(error);
  return loaded;
}

}  // namespace

bool gpu_backend_available() {
  std::error_code ec;
  return std::filesystem::exists(library_path(), ec);
}

bool gpu_driver_present() {
  std::error_code ec;
  return std::filesystem::exists("/dev/nvidiactl", ec) || std::filesystem::exists("/proc/driver/nvidia", ec);
}

GpuBackend& gpu_backend() { return *load().backend; }

void launch_on_gpu(const std::type_info& kernel, int64_t n, const void* functor) {
  gpu_backend().launch(kernel, n, functor);
}

void* gpu_backend_symbol(const char* name) {
  void* symbol = dlsym(load().handle, name);
  if (!symbol) throw Error(fmt::format("the CUDA backend has no symbol {}", name));
  return symbol;
}

}  // namespace dtrain
