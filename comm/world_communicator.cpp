// World communicators by all-reduce algorithm.
#include "comm/world_communicator.h"

#include "comm/hierarchical_communicator.h"
#include "comm/mpi_communicator.h"
#include "core/error.h"

namespace dtrain {

NodeLayout world_node_layout() { return probe_node_layout(MPI_COMM_WORLD); }

std::unique_ptr<Communicator> make_world_communicator(AllreduceAlgorithm algorithm, const CollectiveOptions& options) {
  CollectiveOptions flat = options;
  flat.shared_memory_allreduce = false;
  switch (algorithm) {
    case AllreduceAlgorithm::kHierarchical:
      return std::make_unique<HierarchicalCommunicator>(MPI_COMM_WORLD, options);
    case AllreduceAlgorithm::kFlat:
      return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, flat);
    case AllreduceAlgorithm::kShm:
      return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, options);
    case AllreduceAlgorithm::kAuto:
      break;
  }
  throw Error("make_world_communicator: resolve the 'auto' algorithm with choose_allreduce first");
}

}  // namespace dtrain
