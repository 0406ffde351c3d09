// Stage partitions (Note [Pipeline partition]).
#include "pipeline/partition.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain {

std::vector<StageRange> balanced_partition(const std::vector<int64_t>& layer_parameters, int stages) {
  const size_t n = layer_parameters.size();
  if (stages < 1) throw Error(fmt::format("{} pipeline stages: needs at least 1", stages));
  if (n < static_cast<size_t>(stages))
    throw Error(fmt::format("{} pipeline stages: the model has only {} layers to cut", stages, n));
  const auto P = static_cast<size_t>(stages);
  std::vector<int64_t> prefix(n + 1, 0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + layer_parameters[i];
  // best[k][i]: the best cut of layers [0, i) into k stages: the smallest largest-stage count,
  // then the smallest sum of squared stage counts (so no stage is left with only parameter-free
  // layers while another could give it some), then the earliest cut.
  struct Cost {
    int64_t largest = std::numeric_limits<int64_t>::max();
    double squares = 0;
    bool operator<(const Cost& o) const { return largest != o.largest ? largest < o.largest : squares < o.squares; }
  };
  std::vector<std::vector<Cost>> best(P + 1, std::vector<Cost>(n + 1));
  std::vector<std::vector<size_t>> cut(P + 1, std::vector<size_t>(n + 1, 0));
  best[0][0] = {0, 0};
  constexpr int64_t kInf = std::numeric_limits<int64_t>::max();
  for (size_t k = 1; k <= P; ++k)
    for (size_t i = k; i <= n; ++i)
      for (size_t j = k - 1; j < i; ++j) {
        if (best[k - 1][j].largest == kInf) continue;
        const int64_t stage = prefix[i] - prefix[j];
        const Cost c{std::max(best[k - 1][j].largest, stage),
                     best[k - 1][j].squares + static_cast<double>(stage) * static_cast<double>(stage)};
        if (c < best[k][i]) {  // strict: the earliest cut wins a tie
          best[k][i] = c;
          cut[k][i] = j;
        }
      }
  std::vector<StageRange> out(P);
  size_t end = n;
  for (size_t k = P; k >= 1; --k) {
    out[k - 1] = {cut[k][end], end};
    end = cut[k][end];
  }
  return out;
}

std::vector<StageRange> partition_at(const std::vector<size_t>& split, size_t layers, int stages) {
  if (split.size() + 1 != static_cast<size_t>(stages))
    throw Error(fmt::format("{} cut(s) for {} pipeline stages, which need {}", split.size(), stages, stages - 1));
  std::vector<StageRange> out;
  size_t begin = 0;
  for (size_t cut : split) {
    if (cut <= begin || cut >= layers)
      throw Error(fmt::format("layer {} cannot start a stage (cuts must increase within 1..{})", cut, layers - 1));
    out.push_back({begin, cut});
    begin = cut;
  }
  out.push_back({begin, layers});
  return out;
}

std::string describe_partition(const std::vector<StageRange>& stages) {
  std::string out;
  for (const StageRange& r : stages) out += fmt::format("{}{}-{}", out.empty() ? "" : " | ", r.begin, r.end - 1);
  return out;
}

}  // namespace dtrain
