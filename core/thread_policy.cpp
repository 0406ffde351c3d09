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

}  // namespace dtrain
