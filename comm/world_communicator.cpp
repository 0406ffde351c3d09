// World communicators by all-reduce algorithm.
#include "comm/world_communicator.h"

#include "comm/hierarchical_communicator.h"
#include "comm/mpi_communicator.h"
#include "core/error.h"

namespace dtrain {

NodeLayout world_node_layout() { return probe_node_layout(MPI_COMM_WORLD); }

std::unique_ptr<Communicator> make_world_communicator(AllreduceAlgorithm algorithm) {
  switch (algorithm) {
    case AllreduceAlgorithm::kHierarchical:
      return std::make_unique<HierarchicalCommunicator>(MPI_COMM_WORLD);
    case AllreduceAlgorithm::kFlat:
      return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, /*shared_memory_allreduce=*/false);
    case AllreduceAlgorithm::kShm:
      return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
    case AllreduceAlgorithm::kAuto:
      break;
  }
  throw Error("make_world_communicator: resolve the 'auto' algorithm with choose_allreduce first");
}

}  // namespace dtrain
