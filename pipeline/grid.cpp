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

PipelineGrid make_pipeline_grid(Communicator& world, int stages) {
  if (std::string problem = pipeline_grid_problem(world.size(), stages); !problem.empty()) throw Error(problem);
  PipelineGrid g;
  g.stages = stages;
  g.replicas = world.size() / stages;
  g.stage = world.rank() % stages;
  g.replica = world.rank() / stages;
  // Every rank makes both splits in this order (they are collectives over the world).
  g.data_parallel = world.split(g.stage, g.replica, fmt::format("stage{}", g.stage));
  g.chain = world.split(g.replica, g.stage, fmt::format("pipeline{}", g.replica));
  return g;
}

}  // namespace dtrain
