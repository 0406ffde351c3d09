// MPI start-up and shut-down, and the one-line fatal exit that takes every peer down with it.
#include "comm/mpi_lifecycle.h"

#include <atomic>
#include <charconv>
#include <cstdio>
#include <cstdlib>

#include "comm/mpi_check.h"

namespace dtrain {

namespace {

std::atomic<int> g_world_rank{-1};  // for abort_all, which may run on any thread

std::string rank_for_messages() {
  int rank = g_world_rank.load();
  if (rank >= 0) return std::to_string(rank);
  // Before init (or singleton failures), the launcher's variables still say who we are.
  const std::string launched = launcher_rank();
  return launched.empty() ? "?" : launched;
}

}  // namespace

bool started_by_launcher(const EnvLookup& env) {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
    if (env(name)) return true;
  return env("SLURM_STEP_ID") && env("SLURM_STEP_NUM_TASKS");
}

std::string launcher_world_mismatch(const EnvLookup& env, int world_size) {
  if (env("OMPI_COMM_WORLD_SIZE")) return "";
  const char* source = env("PMI_SIZE") ? "PMI_SIZE" : "SLURM_STEP_NUM_TASKS";
  const std::optional<std::string> text = env(source);
  if (!text) return "";
  int expected = 0;
  auto [ptr, ec] = std::from_chars(text->data(), text->data() + text->size(), expected);
  if (ec != std::errc() || ptr != text->data() + text->size() || expected == world_size) return "";
  const std::string task = env("SLURM_PROCID").value_or("?");
  return fmt::format("this is task {} of the {} that the launcher started ({}={}), but MPI sees a world of {} rank{}: "
                     "MPI was not started through the launcher's PMI, so every task runs alone; under srun use "
                     "--mpi=pmix (srun --mpi=list shows what the cluster offers), or start the job with dtrain-launch",
                     task, expected, source, *text, world_size, world_size == 1 ? "" : "s");
}

std::string launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID", "RANK"})
    if (const char* v = std::getenv(name)) return v;
  return "";
}

bool start_mpi(int* argc, char*** argv, bool yield_when_idle, bool thread_multiple) {
  int initialized = 0;
  MPI_CHECK(MPI_Initialized(&initialized));
  int provided = MPI_THREAD_SINGLE;
  bool started = false;
  if (initialized) {
    MPI_CHECK(MPI_Query_thread(&provided));
  } else {
    // Blocking MPI calls poll. A rank bound to one core must yield while polling, or its
    // communication thread takes that core from its compute (Open MPI yields by itself only when
    // ranks outnumber cores). A rank with cores to spare answers fastest without yielding: on a
    // 16-core VM the 2-rank gradient all-reduce took 102-126 us so, and 224-381 us yielding.
    if (yield_when_idle) setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
    // Sub-communicators each have a communication thread of their own, which may be inside MPI
    // at the same time (Note [Sub-communicators] in comm/communicator.h).
    MPI_CHECK(MPI_Init_thread(argc, argv, thread_multiple ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED, &provided));
    started = true;
  }
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  if (provided < MPI_THREAD_SERIALIZED)
    throw Error(fmt::format("MPI provides thread level {}, dtrain needs MPI_THREAD_SERIALIZED ({}) because collectives "
                            "run on a communication thread",
                            provided, MPI_THREAD_SERIALIZED));
  if (thread_multiple && provided < MPI_THREAD_MULTIPLE)
    throw Error(fmt::format("MPI provides thread level {}, sub-communicators (a pipeline's process grid) need "
                            "MPI_THREAD_MULTIPLE ({}): each runs its own communication thread",
                            provided, MPI_THREAD_MULTIPLE));
  return started;
}

void finish_mpi() {
  int initialized = 0, finalized = 0;
  MPI_CHECK(MPI_Initialized(&initialized));
  MPI_CHECK(MPI_Finalized(&finalized));
  if (initialized && !finalized) MPI_CHECK(MPI_Finalize());
}

void set_world_rank_for_messages(int rank) { g_world_rank = rank; }

void abort_all(const std::string& message, int exit_code) {
  std::fprintf(stderr, "dtrain: rank %s: %s\n", rank_for_messages().c_str(), message.c_str());
  std::fflush(stderr);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  // MPI_Abort may be called while the communication thread is inside a collective (the peer it
  // waits for may be the reason we abort); Open MPI handles that, and nothing else returns.
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::exit(exit_code);
}

}  // namespace dtrain
