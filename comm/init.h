// dtrain::init() / finalize(): MPI start-up and shut-down for a dtrain process, and the
// world communicator every other layer uses. A rank that fails prints its error and calls
// abort_all(), which brings down every peer (MPI_Abort) so none hangs in a collective.
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"

namespace dtrain {

struct DistributedContext {
  std::shared_ptr<Communicator> comm;  // the MPI world communicator (CPU collectives)
};

// Initialises MPI (MPI_THREAD_SERIALIZED or better: only the communication thread calls MPI
// after this), works out local_rank/local_size with MPI_Comm_split_type(SHARED) and
// cross-checks them against OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID and LOCAL_RANK.
// Works under mpirun/srun and as a singleton started directly.
DistributedContext init(int* argc, char*** argv);
void finalize(DistributedContext& ctx);

// This process's rank as its launcher exported it (Open MPI, PMIx, PMI, Slurm, torchrun-style
// RANK), for messages before init(); "" when started without a launcher.
std::string launcher_rank();

// Prints "dtrain: rank R: <message>" to stderr and aborts every rank with `exit_code`.
[[noreturn]] void abort_all(const std::string& message, int exit_code = 1);

}  // namespace dtrain
