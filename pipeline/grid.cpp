// The P x D process grid (Note [Pipeline grid]).
#include "pipeline/grid.h"

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain {

std::string pipeline_grid_problem(int world_size, int stages) {
  if (stages < 1) return fmt::format("{} pipeline stages: needs at least 1", stages);
  if (world_size % stages != 0)
    return fmt::format("{} pipeline stages do not divide the {} rank(s): the grid is stages x replicas, so the world "
                       "size must be a multiple of {}",
                       stages, world_size, stages);
  return "";
}

PipelineGrid make_pipeline_grid(Communicator& world, int stages, const DeviceGroupMaker& device_group) {
  if (std::string problem = pipeline_grid_problem(world.size(), stages); !problem.empty()) throw Error(problem);
  PipelineGrid g;
  g.stages = stages;
  g.replicas = world.size() / stages;
  g.stage = world.rank() % stages;
  g.replica = world.rank() / stages;
  // Every rank makes both splits in this order (they are collectives over the world).
  g.data_parallel = world.split(g.stage, g.replica, fmt::format("stage{}", g.stage));
  g.chain = world.split(g.replica, g.stage, fmt::format("pipeline{}", g.replica));
  if (device_group) {
    // Note [Pipeline on a GPU]: every rank makes its group's first, then its chain's, so no rank
    // waits in one initialisation for a peer that waits in the other.
    g.device_data_parallel = device_group(*g.data_parallel, fmt::format("nccl-stage{}", g.stage));
    // The chain runs point-to-point only (an MPI communicator is one or the other: Note
    // [Point-to-point]), so the device chain is bootstrapped over a copy of it, used once.
    std::unique_ptr<Communicator> bootstrap = world.split(g.replica, g.stage, fmt::format("pipeline{}-init", g.replica));
    g.device_chain = device_group(*bootstrap, fmt::format("nccl-pipeline{}", g.replica));
    bootstrap->shutdown();
  }
  return g;
}

void shutdown_grid(PipelineGrid& grid) {
  if (grid.device_chain) grid.device_chain->shutdown();
  if (grid.device_data_parallel) grid.device_data_parallel->shutdown();
  grid.chain->shutdown();
  grid.data_parallel->shutdown();
}

}  // namespace dtrain
