// The NCCL plugin's entry point (libdtrain_nccl.so; Note [GPU plugins without a cycle] in
// core/gpu_backend.h): comm's Runtime opens it with open_plugin (comm/gpu_plugins.h) and makes
// its gradient communicator through it. No NCCL or CUDA headers here.
#pragma once

#include <cstdint>

#include "comm/communicator.h"
#include "comm/nccl/nccl_communicator.h"
#include "core/device.h"

namespace dtrain {

// Bump whenever NcclPlugin, NcclOptions or the interfaces it passes (Communicator, Work,
// CollectiveLog, Stream) change layout. 2: Work's device timing (Note [Device-timed collectives]
// in comm/communicator.h) added virtuals the plugin's Work overrides. 3: NcclOptions'
// dump_requests (SIGUSR1) and device_timing (timing events only when asked).
inline constexpr uint32_t kNcclPluginApiVersion = 3;
inline constexpr const char* kNcclPluginLibrary = "libdtrain_nccl.so";
inline constexpr const char* kNcclPluginEntryPoint = "dtrain_nccl_plugin_init";

struct NcclPlugin {
  uint32_t api_version;  // first, so a loader can read it whatever the rest's layout
  // Collective over `bootstrap`'s ranks, like NcclCommunicator's constructor; the caller owns the
  // result (delete it through Communicator's virtual destructor).
  Communicator* (*make_communicator)(Communicator& bootstrap, Device device, const NcclOptions& options);
};
//   extern "C" const NcclPlugin* dtrain_nccl_plugin_init(void);

}  // namespace dtrain
