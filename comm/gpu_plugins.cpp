// Opening dtrain's GPU plugins and checking their versions (see gpu_plugins.h).
#include "comm/gpu_plugins.h"

#include <dlfcn.h>

#include <fmt/format.h>

#include "core/error.h"
#include "core/gpu_backend.h"

namespace dtrain {

const void* open_plugin(const std::string& path, const char* entry, uint32_t expected_version) {
  // RTLD_LOCAL: a plugin's symbols stay its own (two builds' plugins never interpose). Never
  // closed: its code may run until exit (a communicator's watchdog, the compute streams).
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) throw Error(fmt::format("cannot load the plugin {}: {}", path, dlerror()));
  using Entry = const void* (*)();
  auto init = reinterpret_cast<Entry>(dlsym(handle, entry));
  if (!init) throw Error(fmt::format("{} has no entry point {} (a library of another dtrain version?)", path, entry));
  const void* plugin = init();
  if (!plugin) throw Error(fmt::format("{}: {} returned nothing", path, entry));
  // The version is the first field of every plugin's struct, whatever the rest looks like.
  const uint32_t version = *static_cast<const uint32_t*>(plugin);
  if (version != expected_version)
    throw Error(fmt::format("{}: plugin API version {}, this dtrain expects {} (a library from another dtrain build)",
                            path, version, expected_version));
  return plugin;
}

namespace {

GpuBackend& load_gpu_backend() {
  const auto* plugin = static_cast<const GpuBackendPlugin*>(
      open_plugin(gpu_plugin_path(kGpuBackendLibrary), kGpuBackendEntryPoint, kGpuBackendApiVersion));
  return *plugin->backend;
}

// Loading comm gives core its loader (installing it opens nothing: that waits until a run asks
// for the backend); dtrain::init() installs it again, explicitly.
[[maybe_unused]] const bool g_installed = (install_gpu_backend_loader(), true);

}  // namespace

void install_gpu_backend_loader() { set_gpu_backend_loader(&load_gpu_backend); }

}  // namespace dtrain
