// The loader of dtrain's GPU plugins (Note [GPU plugins without a cycle] in core/gpu_backend.h):
// libdtrain_cuda.so, the GPU backend core reaches through its registration point, and
// libdtrain_nccl.so, the NCCL communicator the Runtime makes for multi-rank GPU runs. Each is
// opened once, on first use, and checked for its API version before anything in it is called.
#pragma once

#include <cstdint>
#include <string>

namespace dtrain {

// Opens the plugin at `path` (kept open to the end of the process), calls its C entry point
// `entry` (no arguments, returning a pointer to a struct whose first field is a uint32_t API
// version) and returns that struct. Throws Error with one line naming the library and the
// problem: not loadable (dlerror), no such entry point, or "plugin API version X, this dtrain
// expects Y". Loading the same path again returns the same struct.
const void* open_plugin(const std::string& path, const char* entry, uint32_t expected_version);

// Installs the CUDA backend's loader into core; idempotent. dtrain::init() calls it, and so does
// libdtrain_comm when it is loaded; a program that uses CUDA tensors without dtrain::init() and
// without any other call into comm (its linker may then drop libdtrain_comm) calls it first.
void install_gpu_backend_loader();

}  // namespace dtrain
