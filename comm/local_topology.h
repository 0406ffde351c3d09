// Cross-check of the node-local rank and size MPI reports (MPI_Comm_split_type SHARED)
// against what the launcher put in the environment. A disagreement means the ranks would pick
// the wrong GPU or data shard, so it is an error that names the variable and both values.
// Pure: the environment comes in through a lookup function, so tests need no MPI.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace dtrain {

// Returns the value of an environment variable, or nullopt when it is not set.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;

// std::getenv as an EnvLookup.
std::optional<std::string> process_env(const char* name);

// Checks every variable that is set: OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID and LOCAL_RANK
// must equal local_rank; OMPI_COMM_WORLD_LOCAL_SIZE and LOCAL_WORLD_SIZE must equal local_size.
// Throws dtrain::Error on the first mismatch or non-integer value.
void check_local_topology(int local_rank, int local_size, const EnvLookup& env);

}  // namespace dtrain
