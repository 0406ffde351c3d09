// Collective headers and their comparison (see collective_check.h).
#include "comm/collective_check.h"

#include <map>

#include <fmt/format.h>

#include "comm/collective_watchdog.h"

namespace dtrain {

void pack_header_check(const CollectiveHeader& h, int64_t out[8]) {
  const int64_t v[4] = {h.seq, h.kind, h.count, h.dtype};
  for (int i = 0; i < 4; ++i) {
    out[i] = v[i];
    out[4 + i] = -v[i];
  }
}

bool header_check_agrees(const int64_t reduced[8]) {
  for (int i = 0; i < 4; ++i)
    if (reduced[i] != -reduced[4 + i]) return false;  // max != min
  return true;
}

namespace {

// "allreduce of 100 int32", with "#12 " first when ranks are not even at the same number.
std::string describe(const CollectiveHeader& h, bool with_seq) {
  return fmt::format("{}{} of {} {}", with_seq ? fmt::format("#{} ", h.seq) : "", ProgressBoard::kind_name(h.kind),
                     h.count, dtype_name(static_cast<DType>(h.dtype)));
}

}  // namespace

std::string header_mismatch_text(const std::vector<CollectiveHeader>& all) {
  // Groups of ranks with one header each, in order of their lowest rank.
  std::vector<std::pair<CollectiveHeader, std::vector<int>>> groups;
  for (size_t r = 0; r < all.size(); ++r) {
    auto it = groups.begin();
    while (it != groups.end() && !(it->first == all[r])) ++it;
    if (it == groups.end()) groups.push_back({all[r], {static_cast<int>(r)}});
    else it->second.push_back(static_cast<int>(r));
  }
  if (groups.size() <= 1) return "";
  bool same_seq = true;
  for (const CollectiveHeader& h : all) same_seq = same_seq && h.seq == all.front().seq;
  std::string out = fmt::format("ranks issued different collectives at #{}:", all.front().seq);
  for (const auto& [header, ranks] : groups)
    out += fmt::format(" {} {}: {};", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ","), describe(header, !same_seq));
  out.pop_back();
  return out;
}

}  // namespace dtrain
