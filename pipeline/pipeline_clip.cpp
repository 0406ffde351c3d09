// PipelineClipper (see pipeline_clip.h).
#include "pipeline/pipeline_clip.h"

#include <fmt/format.h>

namespace dtrain {

PipelineClipper::PipelineClipper(Communicator& world, PipelineStage& stage) {
  const PipelineGrid& g = stage.grid();
  stages_ = world.split(g.replica, g.stage, fmt::format("pipeline{}-norm", g.replica));
  std::vector<const Parameter*> copies;
  if (stage.tied_copy()) copies.push_back(stage.tied_copy());
  Communicator* sums = stages_.get();
  clipper_ = std::make_unique<GradNormClipper>(
      stage.module().parameters(),
      [sums](float x) {
        sums->allreduce(&x, 1, DType::kF32, ReduceOp::kSum);
        return x;
      },
      /*params_are_a_part=*/true, std::move(copies));
}

void shutdown_pipeline(PipelineGrid& grid, std::optional<PipelineClipper>& clipper) {
  shutdown_grid(grid);
  if (clipper) clipper->shutdown();
}

}  // namespace dtrain
