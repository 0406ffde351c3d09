// Slurm host lists and task counts, expanded.
#include "launcher/slurm.h"

#include <charconv>
#include <limits>

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain::launcher {

namespace {

// A typo like node[1-999999999] must be an error, not an exhausted machine.
constexpr size_t kMaxHosts = size_t{1} << 16;

struct ListError {
  std::string problem;
};

int64_t parse_index(std::string_view digits) {
  int64_t value = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || ec != std::errc() || ptr != digits.data() + digits.size() || value < 0)
    throw ListError{fmt::format("'{}' is not a number", digits)};
  return value;
}

// "01-03,07" -> 01 02 03 07 (each keeps its lower bound's width).
std::vector<std::string> expand_ranges(std::string_view body) {
  std::vector<std::string> out;
  if (body.empty()) throw ListError{"empty []"};
  while (true) {
    const size_t comma = body.find(',');
    const std::string_view range = body.substr(0, comma);
    const size_t dash = range.find('-');
    const std::string_view lo_text = range.substr(0, dash);
    const int64_t lo = parse_index(lo_text);
    const int64_t hi = dash == std::string_view::npos ? lo : parse_index(range.substr(dash + 1));
    if (hi < lo) throw ListError{fmt::format("range '{}' runs backwards", range)};
    if (static_cast<size_t>(hi - lo) >= kMaxHosts - out.size())
      throw ListError{fmt::format("more than {} hosts", kMaxHosts)};
    for (int64_t i = lo; i <= hi; ++i) out.push_back(fmt::format("{:0{}}", i, lo_text.size()));
    if (comma == std::string_view::npos) break;
    body.remove_prefix(comma + 1);
  }
  return out;
}

// One name pattern (no comma outside brackets): the product of its bracket groups.
void expand_name(std::string_view pattern, const std::string& prefix, std::vector<std::string>& out) {
  const size_t open = pattern.find('[');
  if (open == std::string_view::npos) {
    if (pattern.find(']') != std::string_view::npos) throw ListError{"']' without '['"};
    if (out.size() >= kMaxHosts) throw ListError{fmt::format("more than {} hosts", kMaxHosts)};
    out.push_back(prefix + std::string(pattern));
    return;
  }
  const size_t close = pattern.find(']', open);
  if (close == std::string_view::npos) throw ListError{"'[' without ']'"};
  const std::string_view body = pattern.substr(open + 1, close - open - 1);
  if (body.find('[') != std::string_view::npos) throw ListError{"'[' inside []"};
  const std::string head = prefix + std::string(pattern.substr(0, open));
  if (pattern.substr(0, open).find(']') != std::string_view::npos) throw ListError{"']' without '['"};
  for (const std::string& index : expand_ranges(body)) expand_name(pattern.substr(close + 1), head + index, out);
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(std::string_view list) {
  std::vector<std::string> hosts;
  try {
    size_t start = 0;
    int depth = 0;
    for (size_t i = 0; i <= list.size(); ++i) {
      if (i < list.size() && list[i] == '[') ++depth;
      if (i < list.size() && list[i] == ']') --depth;
      if (i < list.size() && !(list[i] == ',' && depth == 0)) continue;
      const std::string_view item = list.substr(start, i - start);
      if (item.empty()) throw ListError{"a host name is empty"};
      expand_name(item, "", hosts);
      start = i + 1;
    }
  } catch (const ListError& e) {
    throw UsageError(fmt::format("Slurm host list '{}': {}", list, e.problem));
  }
  return hosts;
}

std::vector<int> expand_slurm_tasks_per_node(std::string_view spec) {
  std::vector<int> counts;
  auto bad = [&](std::string_view why) { return UsageError(fmt::format("Slurm tasks per node '{}': {}", spec, why)); };
  std::string_view rest = spec;
  while (true) {
    const size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    int64_t repeat = 1;
    if (const size_t paren = item.find("(x"); paren != std::string_view::npos) {
      if (!item.ends_with(')')) throw bad("expected N or N(xM)");
      std::string_view times = item.substr(paren + 2, item.size() - paren - 3);
      try {
        repeat = parse_index(times);
      } catch (const ListError& e) {
        throw bad(e.problem);
      }
      item = item.substr(0, paren);
    }
    int64_t tasks = 0;
    try {
      tasks = parse_index(item);
    } catch (const ListError& e) {
      throw bad(e.problem);
    }
    if (tasks < 1 || repeat < 1) throw bad("counts must be at least 1");
    if (tasks > std::numeric_limits<int>::max() || static_cast<size_t>(repeat) > kMaxHosts - counts.size())
      throw bad(fmt::format("more than {} nodes or too many tasks", kMaxHosts));
    counts.insert(counts.end(), static_cast<size_t>(repeat), static_cast<int>(tasks));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return counts;
}

std::vector<HostSlots> slurm_hosts(const std::map<std::string, std::string>& env) {
  auto nodelist = env.find("SLURM_JOB_NODELIST");
  if (nodelist == env.end()) return {};
  std::vector<HostSlots> hosts;
  for (std::string& name : expand_slurm_nodelist(nodelist->second)) hosts.push_back({std::move(name), 0});
  if (auto per_node = env.find("SLURM_TASKS_PER_NODE"); per_node != env.end()) {
    std::vector<int> counts = expand_slurm_tasks_per_node(per_node->second);
    if (counts.size() != hosts.size())
      throw UsageError(fmt::format("SLURM_TASKS_PER_NODE '{}' gives {} node(s) but SLURM_JOB_NODELIST '{}' names {}",
                                   per_node->second, counts.size(), nodelist->second, hosts.size()));
    for (size_t i = 0; i < hosts.size(); ++i) hosts[i].slots = counts[i];
  } else if (auto uniform = env.find("SLURM_NTASKS_PER_NODE"); uniform != env.end()) {
    std::vector<int> counts = expand_slurm_tasks_per_node(uniform->second);
    if (counts.size() != 1)
      throw UsageError(fmt::format("SLURM_NTASKS_PER_NODE '{}' is not one number", uniform->second));
    for (HostSlots& host : hosts) host.slots = counts[0];
  }
  return hosts;
}

}  // namespace dtrain::launcher
