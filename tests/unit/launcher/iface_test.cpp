// --iface values: names and IPv4 CIDRs in Open MPI's syntax are accepted, anything else is one
// UsageError; a value matches this node when it names one of its interfaces or a CIDR holds
// one of its addresses.
#include "launcher/iface.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"

namespace dtrain::launcher {
namespace {

const std::vector<NetInterface> kNode = {{"lo", 0x7f000001, 8}, {"eth0", 0xc6120002, 24}, {"ib0", 0x0a010203, 16}};

TEST(Iface, NamesAndCidrsAreAccepted) {
  for (const char* good : {"eth1", "enp1s0f0np0.100", "eth0:1", "198.18.0.0/24", "0.0.0.0/0", "10.1.0.0/16,ib0"})
    EXPECT_NO_THROW(check_iface(good)) << good;
}

TEST(Iface, MalformedValuesAreUsageErrors) {
  for (const char* bad : {"", "eth0,", ",eth0", "a b", "10.0.0.0/33", "10.0.0/24", "10.0.0.256/24", "10.0.0.0.0/8",
                          "10.0.0.0/", "/24", "fd00::/8", "enp1s0f0np0.1000", "10.0.0.0/24/1", "10.0.0.-1/8"}) {
    EXPECT_THROW(check_iface(bad), UsageError) << bad;
  }
}

TEST(Iface, MatchesByNameOrByTheSubnetHoldingAnAddress) {
  EXPECT_EQ(unmatched_iface("eth0", kNode), "");
  EXPECT_EQ(unmatched_iface("198.18.0.0/24", kNode), "");
  EXPECT_EQ(unmatched_iface("198.18.0.2/32", kNode), "");
  EXPECT_EQ(unmatched_iface("10.0.0.0/8,eth0", kNode), "");
  EXPECT_EQ(unmatched_iface("0.0.0.0/0", kNode), "");
  EXPECT_EQ(unmatched_iface("198.18.1.0/24", kNode), "198.18.1.0/24");
  EXPECT_EQ(unmatched_iface("198.18.0.3/32", kNode), "198.18.0.3/32");
  EXPECT_EQ(unmatched_iface("eth0,eth1", kNode), "eth1");
  EXPECT_EQ(unmatched_iface("eth", kNode), "eth");  // a prefix is not a name
}

TEST(Iface, RanksReachTheLauncherOnTheChosenNetwork) {
  using ::testing::ElementsAre;
  EXPECT_THAT(addresses_for_ranks("", kNode, /*single_node=*/true), ElementsAre(0x7f000001u));
  EXPECT_THAT(addresses_for_ranks("ib0", kNode, false), ElementsAre(0x0a010203u));
  EXPECT_THAT(addresses_for_ranks("198.18.0.0/24,ib0", kNode, false), ElementsAre(0xc6120002u, 0x0a010203u));
  // No --iface: every address but loopback, which remote nodes cannot use.
  EXPECT_THAT(addresses_for_ranks("", kNode, false), ElementsAre(0xc6120002u, 0x0a010203u));
  EXPECT_THAT(addresses_for_ranks("", {{"lo", 0x7f000001, 8}}, false), ElementsAre(0x7f000001u));
  EXPECT_EQ(ipv4_text(0xc6120002u), "198.18.0.2");
}

TEST(Iface, NcclGetsExactNamesWithCidrsResolvedOnThisNode) {
  EXPECT_EQ(nccl_socket_ifname("eth0", kNode), "=eth0");
  EXPECT_EQ(nccl_socket_ifname("eth0", {}), "=eth0");  // names need no lookup
  EXPECT_EQ(nccl_socket_ifname("10.0.0.0/8", kNode), "=ib0");
  EXPECT_EQ(nccl_socket_ifname("0.0.0.0/0", kNode), "=lo,eth0,ib0");
  EXPECT_EQ(nccl_socket_ifname("ib0,10.1.0.0/16,eth0", kNode), "=ib0,eth0");
  // A subnet no interface is known in: NCCL is left to choose, not given half the list.
  EXPECT_EQ(nccl_socket_ifname("10.1.0.0/16", {}), "");
  EXPECT_EQ(nccl_socket_ifname("eth0,172.16.0.0/12", kNode), "");
}

TEST(Iface, DescribesInterfacesForMessages) {
  EXPECT_EQ(describe_interfaces(kNode), "lo 127.0.0.1/8, eth0 198.18.0.2/24, ib0 10.1.2.3/16");
  EXPECT_EQ(describe_interfaces({}), "none with an IPv4 address");
}

}  // namespace
}  // namespace dtrain::launcher
