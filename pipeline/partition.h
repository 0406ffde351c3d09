// Note [Pipeline partition]: a model that is a Sequential of layers is cut into P consecutive
// stages, stage s holding layers [begin, end). Balanced: the cut that minimises the largest
// stage's parameter count (ties: the most even spread,
// then the earliest cut), every stage at least one layer. Or at the
// layers the user names (the first layer of stages 1..P-1). Every rank
// computes the same cut from the same model: no communication. Pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain {

struct StageRange {
  size_t begin = 0, end = 0;  // layers [begin, end)
  bool operator==(const StageRange&) const = default;
};

// `layer_parameters[i]`: layer i's parameter count. Throws dtrain::Error (one line) when there
// are fewer layers than stages or stages < 1.
std::vector<StageRange> balanced_partition(const std::vector<int64_t>& layer_parameters, int stages);

// `split`: the first layer of stages 1..P-1, strictly increasing, in [1, layers). Throws one line
// naming what is wrong otherwise.
std::vector<StageRange> partition_at(const std::vector<size_t>& split, size_t layers, int stages);

// "0-3 | 4-6" (layers of each stage, inclusive), for logs.
std::string describe_partition(const std::vector<StageRange>& stages);

}  // namespace dtrain
