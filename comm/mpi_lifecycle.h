// The process's MPI life: whether a launcher started this process (then it is one rank of a job
// and MPI must start), MPI start-up and shut-down, and abort_all(), the one-line fatal exit that
// brings every peer down with it (MPI_Abort) so none hangs in a collective.
#pragma once

#include <string>

#include "comm/local_topology.h"

namespace dtrain {

// True when mpirun (OMPI_COMM_WORLD_SIZE), a PMI/PMIx server (PMIX_RANK, PMI_RANK, PMI_SIZE) or
// a Slurm job step (SLURM_STEP_ID with SLURM_STEP_NUM_TASKS) started this process. Pure.
bool started_by_launcher(const EnvLookup& env);

// "" when the MPI world has the size the process's launcher started, else the one-line problem.
// Under srun (a job step: SLURM_STEP_NUM_TASKS; an sbatch batch script has no job step and no
// such variable) the world must have SLURM_STEP_NUM_TASKS ranks: an MPI that was not started
// through Slurm's PMI makes every task a one-rank world of its own. A PMI server's PMI_SIZE is
// compared instead when set (srun --mpi=pmi2, MPICH's hydra); under mpirun (OMPI_COMM_WORLD_SIZE)
// the Slurm step, if any, is mpirun's daemons', so there is nothing to compare. Pure.
std::string launcher_world_mismatch(const EnvLookup& env, int world_size);

// This process's rank as its launcher exported it (Open MPI, PMIx, PMI, Slurm, torchrun-style
// RANK), for messages before MPI is up; "" when started without a launcher.
std::string launcher_rank();

// Initialises MPI (MPI_THREAD_SERIALIZED or better: only communication threads call MPI after
// this) unless it already is, with errors returned rather than fatal. `yield_when_idle`: blocking
// MPI calls yield the core while they poll. Returns true when this call initialised MPI.
bool start_mpi(int* argc, char*** argv, bool yield_when_idle, bool thread_multiple = false);
// MPI_Finalize, if MPI is up and not finalised.
void finish_mpi();
// Records this process's world rank for abort_all's messages.
void set_world_rank_for_messages(int rank);

// Prints "dtrain: rank R: <message>" to stderr and ends the process with `exit_code`, taking
// every peer down too (MPI_Abort) when MPI is running.
[[noreturn]] void abort_all(const std::string& message, int exit_code = 1);

}  // namespace dtrain
