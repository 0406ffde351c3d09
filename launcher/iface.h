// --iface: which network Open MPI's TCP messages and out-of-band traffic (and NCCL's sockets) use, as interface
// names or IPv4 CIDRs (Open MPI's btl_tcp_if_include / oob_tcp_if_include syntax), checked for
// form and against this node's interfaces. Open MPI itself only warns about a value that
// matches nothing and then uses every interface, so a typo would go unnoticed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::launcher {

// One address of one interface of this node (getifaddrs; IPv4 only).
struct NetInterface {
  std::string name;
  uint32_t ipv4 = 0;  // host byte order
  int prefix_len = 0;
  friend bool operator==(const NetInterface&, const NetInterface&) = default;
};

// Throws UsageError unless every comma-separated item is an interface name (1-15 bytes) or an
// IPv4 CIDR such as 10.1.0.0/16.
void check_iface(std::string_view spec);

// The first item of spec that names no interface of `interfaces` (a name equal to one, a CIDR
// containing one's address); "" when all match.
std::string unmatched_iface(std::string_view spec, const std::vector<NetInterface>& interfaces);

// The addresses of this node at which ranks can reach dtrain-launch, best first: 127.0.0.1 when
// every rank runs here; else the addresses --iface selects (spec non-empty), else every
// non-loopback address (loopback last, for the ranks on this node, when there is none other).
std::vector<uint32_t> addresses_for_ranks(std::string_view spec, const std::vector<NetInterface>& interfaces,
                                          bool single_node);

// NCCL_SOCKET_IFNAME for the ranks (NCCL's bootstrap and socket transport pick their own
// interface otherwise, not the one --iface chose for MPI): "=eth1,ib0", exact names in NCCL's
// '=' form, each CIDR replaced by the names of `interfaces` holding an address in it. "" when a
// CIDR cannot be resolved (no interface of `interfaces` in it, e.g. they are unknown): NCCL then
// picks as it would without --iface, rather than be handed a subset of what was asked.
std::string nccl_socket_ifname(std::string_view spec, const std::vector<NetInterface>& interfaces);

// "1.2.3.4" for an IPv4 address in host byte order.
std::string ipv4_text(uint32_t address);

// "eth0 198.18.0.1/24, lo 127.0.0.1/8" for messages.
std::string describe_interfaces(const std::vector<NetInterface>& interfaces);

}  // namespace dtrain::launcher
