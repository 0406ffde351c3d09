// Reads the core count (core/thread_policy.h, from hwloc), user id, network interfaces and environment.
#include "launcher/host_info.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <bit>
#include <utility>

#include "core/thread_policy.h"

extern char** environ;

namespace dtrain::launcher {

std::vector<NetInterface> network_interfaces() {
  std::vector<NetInterface> interfaces;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return interfaces;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET || a->ifa_netmask == nullptr) continue;
    const auto* address = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    const auto* mask = reinterpret_cast<const sockaddr_in*>(a->ifa_netmask);
    interfaces.push_back({a->ifa_name, ntohl(address->sin_addr.s_addr), std::popcount(mask->sin_addr.s_addr)});
  }
  freeifaddrs(list);
  return interfaces;
}

LaunchHost current_host() {
  LaunchHost host;
  // The cores the launcher itself may run on (its affinity: a Slurm allocation's, say).
  host.cores = probe_cpu_topology().bound_cores;
  host.is_root = geteuid() == 0;
  host.stdout_is_tty = isatty(STDOUT_FILENO) == 1;
  host.interfaces = network_interfaces();
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    host.env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return host;
}

}  // namespace dtrain::launcher
