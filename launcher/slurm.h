// The nodes of a Slurm allocation, for dtrain-launch started inside one (sbatch, salloc):
// Slurm's compressed host lists ("node[01-03,07],gpu5") and task counts ("2(x3),1") expanded,
// read from the environment passed in. Pure: nothing is looked up.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/launch_options.h"

namespace dtrain::launcher {

// "node[01-03,07],gpu5" -> node01 node02 node03 node07 gpu5. Brackets may appear more than once
// in a name ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2); a range keeps its lower bound's width
// ("[08-10]" -> 08 09 10). A malformed list is a UsageError naming it.
std::vector<std::string> expand_slurm_nodelist(std::string_view list);

// SLURM_TASKS_PER_NODE: "2(x3),1" -> 2 2 2 1.
std::vector<int> expand_slurm_tasks_per_node(std::string_view spec);

// The allocation's nodes and ranks per node from SLURM_JOB_NODELIST with SLURM_TASKS_PER_NODE
// (else SLURM_NTASKS_PER_NODE, the same on every node; else slots 0: not stated). Empty
// outside an allocation.
std::vector<HostSlots> slurm_hosts(const std::map<std::string, std::string>& env);

}  // namespace dtrain::launcher
