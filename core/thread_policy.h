// The CPU-thread policy: how many threads each rank's BLAS may use and whether a rank's
// communication thread must yield while it polls. The one place that decides it: the trainer's
// ranks and dtrain-launch (which exports OPENBLAS_NUM_THREADS to them) both ask here.
// The topology comes from hwloc; the decisions are pure functions of it.
#pragma once

#include <cstdint>
#include <utility>

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

// How one CPU GEMM, row-major C[m,n] = op(A)[m,k] op(B)[k,n], is cut across a rank's threads
// (Note [One pool, sleeping waits] in core/ops.cpp): C's rows (or columns) in `parts` blocks of
// `block` (a multiple of kGemmSplitAlign; the last may be shorter), each a GEMM of its own with
// the whole k, so every element of C is summed in the same order whatever the block.
struct GemmSplit {
  int parts = 1;
  bool rows = true;    // split m (C's rows); else n (C's columns)
  int64_t extent = 0;  // m or n
  int64_t block = 0;
  // [begin, end) of part `i` along the split side.
  std::pair<int64_t, int64_t> range(int i) const;
};

// Below this many FLOPs (2mnk) per thread, waking another thread does not reliably pay.
// Measured (2-core AMD EPYC VM, nice -20, best of 1000 calls; 1 thread -> 2): 64 x 128 x 784
// (12.8 MFLOP) 137 -> 143 us; 64 x 256 x 784 (25.7) 272 -> 145-239 us but its weight gradient
// 256 x 784 x 64 245 -> 259-264 us, and the whole hidden-256 MLP ran at 0.77x of one thread
// (bench/threads.sh, machine loaded); 64 x 2048 x 784 (205) 2303 -> 1282-1402 us. So the
// hidden-2048 layers split, the hidden-256 ones and the 64 x 10 x 256 output layer do not.
constexpr double kGemmMinFlopsPerThread = 16e6;
constexpr int64_t kGemmSplitAlign = 16;  // blocks are whole multiples of the kernels' tiles

// The pure decision: at most `threads` parts, none smaller than kGemmMinFlopsPerThread or
// kGemmSplitAlign along the split side (C's longer side). One part when threads <= 1.
GemmSplit plan_gemm_split(int64_t m, int64_t n, int64_t k, int threads);

}  // namespace dtrain
