// PipelineClipper: --clip-grad-norm over a pipeline's stages (the image models' and the GPT's
// loops, app/pipeline_trainer.cpp and app/lm_pipeline_trainer.cpp).
//
// Note [Pipeline gradient norm]: the global norm is the whole model's, as
// torch.nn.utils.clip_grad_norm_ on the unsplit model: each stage's sum of squares of its
// gradients (after its replicas' sum, so a stage's replicas hold the same bits; the tied
// weight's second copy left out: Note [Tied stages]), added over the pipeline's stages, then
// every stage scales its gradients by the same coefficient. The sums travel on a communicator of
// each pipeline's own (its stages, rank = stage), not on the chain, which runs point-to-point
// only; replicas' pipelines add the same numbers in the same order, so every rank of the world
// takes the same decision.
#pragma once

#include <memory>
#include <optional>

#include "comm/communicator.h"
#include "model/grad_clip.h"
#include "pipeline/pipeline_stage.h"

namespace dtrain {

class PipelineClipper {
 public:
  // Collective over `world` (the grid's world: it splits the pipelines' communicators).
  PipelineClipper(Communicator& world, PipelineStage& stage);

  // After the step's gradient sums: the global norm, and with max_norm > 0 the gradients scaled
  // by min(1, max_norm / (norm + 1e-6)). Collective over this pipeline's stages.
  void clip(float max_norm) { clipper_->clip(max_norm); }
  // The last clip()'s norm, before clipping (waits for it). For logs.
  float last_norm() const { return clipper_->last_norm(); }
  // At the run's end, beside the grid's communicators.
  void shutdown() { stages_->shutdown(); }

 private:
  std::unique_ptr<Communicator> stages_;  // this pipeline's stages, for the sums of squares
  std::unique_ptr<GradNormClipper> clipper_;
};

// At the run's end or a stop, on every rank: the grid's communicators and the clipper's, if any.
void shutdown_pipeline(PipelineGrid& grid, std::optional<PipelineClipper>& clipper);

}  // namespace dtrain
