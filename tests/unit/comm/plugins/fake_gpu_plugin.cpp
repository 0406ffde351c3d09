// A stand-in for libdtrain_cuda.so (tests/unit/comm/gpu_plugins_test.cpp): the same entry point,
// returning a GpuBackendPlugin whose version is FAKE_PLUGIN_API_VERSION and whose backend is
// null (the tests never call it). Built twice: with this build's version and with another.
#include "core/gpu_backend.h"

extern "C" const dtrain::GpuBackendPlugin* dtrain_cuda_backend_init() {
  static const dtrain::GpuBackendPlugin plugin{FAKE_PLUGIN_API_VERSION, nullptr};
  return &plugin;
}
