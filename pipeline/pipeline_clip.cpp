// PipelineClipper (see pipeline_clip.h).
#include "pipeline/pipeline_clip.h"

#include <fmt/format.h>

#include "model/flat_store.h"

namespace dtrain {

PipelineClipper::PipelineClipper(Communicator& world, PipelineStage& stage) {
  const PipelineGrid& g = stage.grid();
  stages_ = world.split(g.replica, g.stage, fmt::format("pipeline{}-norm", g.replica));
  std::vector<const Parameter*> copies;
  if (stage.tied_copy()) copies.push_back(stage.tied_copy());
  Communicator* sums = stages_.get();
  // ZeRO-2 (Note [Pipeline ZeRO-1] in app/pipeline_zero.h): a replica holds the sums of its chunk
  // only, so its chunk's squares are added over the stage's replicas first (every replica the
  // same bits), then over the stages as above.
  const std::vector<Parameter*> params = stage.module().parameters();
  Communicator* replicas =
      !params.empty() && params.front()->store && params.front()->store->grads_sharded() ? g.data_parallel.get()
                                                                                          : nullptr;
  clipper_ = std::make_unique<GradNormClipper>(
      params,
      [sums, replicas](float x) {
        if (replicas) replicas->allreduce(&x, 1, DType::kF32, ReduceOp::kSum);
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
