// How a job all-reduces on CPU: the algorithm a user asks for (--allreduce in the app) and the
// pure decision that turns "auto" into one algorithm for the job's layout. Every rank decides
// from the same global facts (world size, node count), so every rank takes the same path.
#pragma once

#include <optional>
#include <string>

namespace dtrain {

enum class AllreduceAlgorithm {
  kAuto,          // hierarchical on a multi-node job with a node of several ranks; shm on one node
  kFlat,          // MPI_Allreduce over the whole world
  kShm,           // node-shared windows (every rank on one node)
  kHierarchical,  // shm inside each node, MPI among one leader per node, shared back in the node
};

const char* allreduce_algorithm_name(AllreduceAlgorithm a);  // "auto", "flat", "shm", "hierarchical"
std::optional<AllreduceAlgorithm> parse_allreduce_algorithm(const std::string& name);

// The job's layout as every rank sees it: total ranks, nodes (MPI_COMM_TYPE_SHARED groups), and
// the most ranks any node has.
struct NodeLayout {
  int world_size = 1;
  int nodes = 1;
  int max_local_size = 1;
};

struct AllreduceChoice {
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kFlat;
  std::string reason;  // one line for logs: why this algorithm
};

// Never kAuto. auto: one rank -> flat; one node -> shm; several nodes with a node of several
// ranks -> hierarchical; one rank per node -> flat (a hierarchy would add nothing). An explicit
// choice is kept, except that shm on a job that spans nodes throws dtrain::Error (no shared
// memory between nodes). Pure.
AllreduceChoice choose_allreduce(AllreduceAlgorithm requested, const NodeLayout& layout);

}  // namespace dtrain
