// The GPU kernels of the backend library by functor type (kernel_registry.h): filled by the
// DTRAIN_REGISTER_KERNEL lines of the .cu files when the library loads, read by every launch.
#include <typeindex>
#include <unordered_map>

#include <fmt/format.h>

#include "core/cuda/kernel_registry.h"
#include "core/error.h"

namespace dtrain::cuda {

namespace {

// Filled by static initialisers (one thread, at load), then only read: no lock needed after.
std::unordered_map<std::type_index, ErasedLaunch>& registry() {
  static std::unordered_map<std::type_index, ErasedLaunch> kernels;
  return kernels;
}

}  // namespace

bool register_kernel(const std::type_info& kernel, ErasedLaunch launch) {
  registry().emplace(std::type_index(kernel), launch);
  return true;
}

void launch_registered(const std::type_info& kernel, int64_t n, const void* functor) {
  const auto it = registry().find(std::type_index(kernel));
  if (it == registry().end())
    throw Error(fmt::format("no CUDA kernel is registered for functor type {} (add DTRAIN_REGISTER_KERNEL to a .cu "
                            "file of the GPU backend)",
                            kernel.name()));
  it->second(n, functor);
}

}  // namespace dtrain::cuda
