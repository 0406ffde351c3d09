// Communicators over every rank of the MPI job (MPI_COMM_WORLD) for a chosen all-reduce
// algorithm, so callers above comm/ (the Runtime, `dtrain bench allreduce`) never name MPI.
// MPI must be running (dtrain::init under a launcher). Each call is collective: every rank
// makes the same calls in the same order, with no other MPI call in flight.
#pragma once

#include <memory>

#include "comm/allreduce_algorithm.h"
#include "comm/communicator.h"
#include "comm/mpi_communicator.h"

namespace dtrain {

// The world's layout: ranks, nodes, most ranks on one node.
NodeLayout world_node_layout();

// flat: MPI_Allreduce; shm: the node-shared windows (falls back to MPI_Allreduce, with
// describe() saying so, where a window cannot be made); hierarchical: HierarchicalCommunicator.
// `options`: deadlines and the flight recorder of every MPI communicator it makes. `algorithm`
// must not be kAuto (resolve it with choose_allreduce first).
std::unique_ptr<Communicator> make_world_communicator(AllreduceAlgorithm algorithm,
                                                      const CollectiveOptions& options = {});

}  // namespace dtrain
