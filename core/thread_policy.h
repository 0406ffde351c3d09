// The CPU-thread policy: how many threads each rank's BLAS may use and whether a rank's
// communication thread must yield while it polls. The one place that decides it: the trainer's
// ranks and dtrain-launch (which exports OPENBLAS_NUM_THREADS to them) both ask here.
// The topology comes from hwloc; the decisions are pure functions of it.
#pragma once

namespace dtrain {

struct CpuTopology {
  int node_cores = 1;   // physical cores of this node the process is allowed to use (cgroup, cpuset)
  int bound_cores = 1;  // physical cores in the process's CPU binding (mpirun --bind-to core: 1)
};

// hwloc's view of this machine and of the calling process's binding. Never fails: without a
// usable topology it reports the online CPUs as cores.
CpuTopology probe_cpu_topology();

// Threads per rank when `ranks_per_node` ranks share `node_cores` cores: the cores shared
// evenly, at least one each (what dtrain-launch binds and exports).
int threads_per_rank(int node_cores, int ranks_per_node);

// A rank's BLAS threads: `requested` when positive; otherwise the node's cores shared among its
// `local_ranks`, but never more than the rank is bound to (plain mpirun binds each of 2 ranks to
// one core, where more threads would only take turns).
int blas_threads_for_rank(int requested, const CpuTopology& topology, int local_ranks);

// A rank bound to one core must yield while its communication thread polls, or the poll takes
// that core from its compute (measured: Note in comm/init.cpp).
inline bool comm_thread_should_yield(const CpuTopology& topology) { return topology.bound_cores < 2; }

}  // namespace dtrain
