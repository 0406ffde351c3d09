// The NCCL plugin's one entry point (see nccl_plugin.h).
#include "comm/nccl/nccl_plugin.h"

namespace {

dtrain::Communicator* make_nccl_communicator(dtrain::Communicator& bootstrap, dtrain::Device device,
                                             const dtrain::NcclOptions& options) {
  return new dtrain::NcclCommunicator(bootstrap, device, options);
}

}  // namespace

extern "C" const dtrain::NcclPlugin* dtrain_nccl_plugin_init() {
  static const dtrain::NcclPlugin plugin{dtrain::kNcclPluginApiVersion, &make_nccl_communicator};
  return &plugin;
}
