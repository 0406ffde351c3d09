#include "core/thread_policy.h"

#include <hwloc.h>

#include <algorithm>
#include <thread>

namespace dtrain {

namespace {

// Cores with at least one processing unit in `set` (a core half in the set still runs a thread).
int cores_touching(hwloc_topology_t topology, hwloc_const_cpuset_t set) {
  int count = 0;
  for (hwloc_obj_t core = hwloc_get_next_obj_by_type(topology, HWLOC_OBJ_CORE, nullptr); core != nullptr;
       core = hwloc_get_next_obj_by_type(topology, HWLOC_OBJ_CORE, core))
    count += hwloc_bitmap_intersects(core->cpuset, set) ? 1 : 0;
  return count;
}

}  // namespace

CpuTopology probe_cpu_topology() {
  const int online = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  CpuTopology result{online, online};
  hwloc_topology_t topology = nullptr;
  if (hwloc_topology_init(&topology) != 0) return result;
  // Cores only: no PCI or OS-device discovery (slow, and it would wake GPU drivers).
  hwloc_topology_set_io_types_filter(topology, HWLOC_TYPE_FILTER_KEEP_NONE);
  if (hwloc_topology_load(topology) == 0) {
    result.node_cores = std::max(1, cores_touching(topology, hwloc_topology_get_allowed_cpuset(topology)));
    hwloc_bitmap_t bound = hwloc_bitmap_alloc();
    if (bound && hwloc_get_cpubind(topology, bound, HWLOC_CPUBIND_PROCESS) == 0)
      result.bound_cores = std::max(1, cores_touching(topology, bound));
    else
      result.bound_cores = result.node_cores;
    hwloc_bitmap_free(bound);
  }
  hwloc_topology_destroy(topology);
  return result;
}

int threads_per_rank(int node_cores, int ranks_per_node) {
  return std::max(1, std::max(1, node_cores) / std::max(1, ranks_per_node));
}

int blas_threads_for_rank(int requested, const CpuTopology& topology, int local_ranks) {
  if (requested > 0) return requested;
  return std::max(1, std::min(topology.bound_cores, threads_per_rank(topology.node_cores, local_ranks)));
}

std::pair<int64_t, int64_t> GemmSplit::range(int i) const {
  const int64_t begin = std::min(extent, static_cast<int64_t>(i) * block);
  return {begin, std::min(extent, begin + block)};
}

GemmSplit plan_gemm_split(int64_t m, int64_t n, int64_t k, int threads) {
  GemmSplit split;
  split.rows = m >= n;
  split.extent = split.rows ? m : n;
  split.block = split.extent;
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const int64_t by_flops = static_cast<int64_t>(flops / kGemmMinFlopsPerThread);
  const int64_t by_side = split.extent / kGemmSplitAlign;
  const int64_t parts = std::min({static_cast<int64_t>(threads), by_flops, by_side});
  if (parts <= 1) return split;
  // Equal blocks rounded up to the alignment; rounding can leave fewer parts than asked.
  const int64_t per_part = (split.extent + parts - 1) / parts;
  split.block = (per_part + kGemmSplitAlign - 1) / kGemmSplitAlign * kGemmSplitAlign;
  split.parts = static_cast<int>((split.extent + split.block - 1) / split.block);
  return split;
}

}  // namespace dtrain
