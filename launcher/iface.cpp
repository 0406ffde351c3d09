// --iface values: their form, and whether this node has what they name.
#include "launcher/iface.h"

#include <algorithm>
#include <charconv>
#include <optional>

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain::launcher {

namespace {

struct Cidr {
  uint32_t network = 0;
  int prefix_len = 0;
};

// 0..most written with 1 to 3 decimal digits (no sign).
std::optional<int> small_number(std::string_view digits, int most) {
  auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  if (digits.empty() || digits.size() > 3 || !std::all_of(digits.begin(), digits.end(), is_digit)) return std::nullopt;
  int value = 0;
  std::from_chars(digits.data(), digits.data() + digits.size(), value);
  return value <= most ? std::optional<int>(value) : std::nullopt;
}

std::optional<Cidr> parse_cidr(std::string_view text) {
  const size_t slash = text.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  Cidr cidr;
  std::string_view address = text.substr(0, slash);
  for (int part = 0; part < 4; ++part) {
    const size_t dot = address.find('.');
    if ((dot == std::string_view::npos) != (part == 3)) return std::nullopt;
    std::optional<int> octet = small_number(address.substr(0, dot), 255);
    if (!octet) return std::nullopt;
    cidr.network = (cidr.network << 8) | static_cast<uint32_t>(*octet);
    address.remove_prefix(part == 3 ? address.size() : dot + 1);
  }
  std::optional<int> prefix = small_number(text.substr(slash + 1), 32);
  if (!prefix) return std::nullopt;
  cidr.prefix_len = *prefix;
  return cidr;
}

// Linux interface names: 1 to 15 bytes, no '/', whitespace or ','.
bool is_interface_name(std::string_view text) {
  return !text.empty() && text.size() <= 15 && std::none_of(text.begin(), text.end(), [](char c) {
    return c == '/' || c == ',' || c == ' ' || c == '\t' || c == '\n';
  });
}

bool contains(const Cidr& cidr, uint32_t address) {
  const uint32_t mask = cidr.prefix_len == 0 ? 0 : ~uint32_t{0} << (32 - cidr.prefix_len);
  return (address & mask) == (cidr.network & mask);
}

template <typename F>
void for_each_item(std::string_view spec, F&& f) {
  while (true) {
    const size_t comma = spec.find(',');
    f(spec.substr(0, comma));
    if (comma == std::string_view::npos) break;
    spec.remove_prefix(comma + 1);
  }
}

}  // namespace

void check_iface(std::string_view spec) {
  for_each_item(spec, [](std::string_view item) {
    if (item.find('/') != std::string_view::npos ? !parse_cidr(item) : !is_interface_name(item))
      throw UsageError(fmt::format("--iface: '{}' is neither an interface name (eth1) nor an IPv4 CIDR (10.1.0.0/16)",
                                   item));
  });
}

std::string unmatched_iface(std::string_view spec, const std::vector<NetInterface>& interfaces) {
  std::string unmatched;
  for_each_item(spec, [&](std::string_view item) {
    if (!unmatched.empty()) return;
    const std::optional<Cidr> cidr = parse_cidr(item);
    const bool found = std::any_of(interfaces.begin(), interfaces.end(), [&](const NetInterface& i) {
      return cidr ? contains(*cidr, i.ipv4) : i.name == item;
    });
    if (!found) unmatched = item;
  });
  return unmatched;
}

std::vector<uint32_t> addresses_for_ranks(std::string_view spec, const std::vector<NetInterface>& interfaces,
                                          bool single_node) {
  constexpr uint32_t kLoopback = 0x7f000001;
  if (single_node) return {kLoopback};
  std::vector<uint32_t> chosen;
  auto add = [&](uint32_t address) {
    if (std::find(chosen.begin(), chosen.end(), address) == chosen.end()) chosen.push_back(address);
  };
  if (!spec.empty()) {
    for_each_item(spec, [&](std::string_view item) {
      const std::optional<Cidr> cidr = parse_cidr(item);
      for (const NetInterface& i : interfaces)
        if (cidr ? contains(*cidr, i.ipv4) : i.name == item) add(i.ipv4);
    });
  }
  if (chosen.empty()) {
    for (const NetInterface& i : interfaces)
      if ((i.ipv4 >> 24) != 127) add(i.ipv4);
  }
  if (chosen.empty()) add(kLoopback);
  return chosen;
}

std::string nccl_socket_ifname(std::string_view spec, const std::vector<NetInterface>& interfaces) {
  std::vector<std::string> names;
  bool resolved = true;
  auto add = [&](std::string_view name) {
    if (std::find(names.begin(), names.end(), name) == names.end()) names.emplace_back(name);
  };
  for_each_item(spec, [&](std::string_view item) {
    const std::optional<Cidr> cidr = parse_cidr(item);
    if (!cidr) return add(item);
    bool found = false;
    for (const NetInterface& i : interfaces) {
      if (!contains(*cidr, i.ipv4)) continue;
      add(i.name);
      found = true;
    }
    resolved = resolved && found;
  });
  if (!resolved || names.empty()) return "";
  std::string value = "=";
  for (const std::string& name : names) value += (value.size() > 1 ? "," : "") + name;
  return value;
}

std::string ipv4_text(uint32_t address) {
  return fmt::format("{}.{}.{}.{}", address >> 24, (address >> 16) & 255, (address >> 8) & 255, address & 255);
}

std::string describe_interfaces(const std::vector<NetInterface>& interfaces) {
  std::string text;
  for (const NetInterface& i : interfaces)
    text += fmt::format("{}{} {}/{}", text.empty() ? "" : ", ", i.name, ipv4_text(i.ipv4), i.prefix_len);
  return text.empty() ? "none with an IPv4 address" : text;
}

}  // namespace dtrain::launcher
