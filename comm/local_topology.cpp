// Node-local rank/size cross-check against launcher environment variables.
#include "comm/local_topology.h"

#include <charconv>
#include <cstdlib>

#include "core/error.h"

namespace dtrain {

namespace {

void check_one(const EnvLookup& env, const char* name, int expected, const char* what) {
  std::optional<std::string> value = env(name);
  if (!value) return;
  int parsed = 0;
  const char* end = value->data() + value->size();
  auto [ptr, ec] = std::from_chars(value->data(), end, parsed);
  if (value->empty() || ec != std::errc() || ptr != end)
    throw Error(fmt::format("environment variable {}='{}' is not an integer (expected the {})", name, *value, what));
  if (parsed != expected)
    throw Error(fmt::format("{} mismatch: {}={} but MPI (MPI_COMM_TYPE_SHARED) gives {} {}", what, name, parsed, what,
                            expected));
}

}  // namespace

std::optional<std::string> process_env(const char* name) {
  if (const char* v = std::getenv(name)) return std::string(v);
  return std::nullopt;
}

void check_local_topology(int local_rank, int local_size, const EnvLookup& env) {
  // Only the launcher that started this process speaks for it: under mpirun inside a Slurm
  // allocation the ranks inherit the batch step's SLURM_LOCALID, which describes orted, not them.
  if (env("OMPI_COMM_WORLD_LOCAL_RANK")) {
    check_one(env, "OMPI_COMM_WORLD_LOCAL_RANK", local_rank, "local rank");
    check_one(env, "OMPI_COMM_WORLD_LOCAL_SIZE", local_size, "local size");
  } else if (env("SLURM_LOCALID")) {
    check_one(env, "SLURM_LOCALID", local_rank, "local rank");
  } else {
    check_one(env, "LOCAL_RANK", local_rank, "local rank");
    check_one(env, "LOCAL_WORLD_SIZE", local_size, "local size");
  }
}

}  // namespace dtrain
