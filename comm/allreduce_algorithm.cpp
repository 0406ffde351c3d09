// The --allreduce vocabulary and the pure choice of an algorithm for a job's layout.
#include "comm/allreduce_algorithm.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/named_enum.h"

namespace dtrain {

namespace {

constexpr auto kAlgorithms = enum_names<AllreduceAlgorithm>(
    std::pair{AllreduceAlgorithm::kAuto, "auto"}, std::pair{AllreduceAlgorithm::kFlat, "flat"},
    std::pair{AllreduceAlgorithm::kShm, "shm"}, std::pair{AllreduceAlgorithm::kHierarchical, "hierarchical"});

}  // namespace

const char* allreduce_algorithm_name(AllreduceAlgorithm a) { return kAlgorithms.name(a); }

std::optional<AllreduceAlgorithm> parse_allreduce_algorithm(const std::string& name) { return kAlgorithms.parse(name); }

AllreduceChoice choose_allreduce(AllreduceAlgorithm requested, const NodeLayout& layout) {
  const std::string shape = fmt::format("{} rank(s) on {} node(s), at most {} per node", layout.world_size,
                                        layout.nodes, layout.max_local_size);
  switch (requested) {
    case AllreduceAlgorithm::kFlat:
      return {AllreduceAlgorithm::kFlat, "flat (requested)"};
    case AllreduceAlgorithm::kHierarchical:
      return {AllreduceAlgorithm::kHierarchical, "hierarchical (requested)"};
    case AllreduceAlgorithm::kShm:
      if (layout.nodes > 1)
        throw Error(fmt::format("the shared-memory all-reduce needs every rank on one node, but the job has {}; use "
                                "flat or hierarchical",
                                shape));
      return {AllreduceAlgorithm::kShm, "shm (requested)"};
    case AllreduceAlgorithm::kAuto:
      break;
  }
  if (layout.world_size <= 1) return {AllreduceAlgorithm::kFlat, "flat (auto: one rank)"};
  if (layout.nodes <= 1) return {AllreduceAlgorithm::kShm, fmt::format("shm (auto: {})", shape)};
  if (layout.max_local_size > 1) return {AllreduceAlgorithm::kHierarchical, fmt::format("hierarchical (auto: {})", shape)};
  return {AllreduceAlgorithm::kFlat, fmt::format("flat (auto: {}; nothing to share inside a node)", shape)};
}

}  // namespace dtrain
