// Reads the core count (sysfs topology within the affinity mask), user id and environment.
#include "launcher/host_info.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sched.h>
#include <unistd.h>

#include <bit>

#include <fstream>
#include <set>
#include <thread>
#include <utility>

extern char** environ;

namespace dtrain::launcher {

namespace {

bool read_int(const std::string& path, int& value) {
  std::ifstream in(path);
  return static_cast<bool>(in >> value);
}

}  // namespace

int physical_cores() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  std::set<std::pair<int, int>> cores;  // (package, core) pairs: hyperthreads share one
  if (sched_getaffinity(0, sizeof mask, &mask) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (!CPU_ISSET(cpu, &mask)) continue;
      std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
      int package = 0, core = 0;
      if (!read_int(dir + "physical_package_id", package) || !read_int(dir + "core_id", core)) {
        cores.clear();
        break;
      }
      cores.insert({package, core});
    }
  }
  if (!cores.empty()) return static_cast<int>(cores.size());
  return std::max(1u, std::thread::hardware_concurrency());
}

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
  host.cores = physical_cores();
  host.is_root = geteuid() == 0;
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
