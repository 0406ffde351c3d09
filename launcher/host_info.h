// The facts about this machine that shape the mpirun command: physical cores this process may
// use, whether it runs as root, its environment and network interfaces (the only non-pure part
// of the launcher).
#pragma once

#include "launcher/mpirun_command.h"

namespace dtrain::launcher {

// IPv4 addresses of this node's interfaces (getifaddrs); empty if they cannot be read.
std::vector<NetInterface> network_interfaces();

LaunchHost current_host();

}  // namespace dtrain::launcher
