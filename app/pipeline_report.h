// What the pipeline loops (app/pipeline_trainer.cpp, app/lm_pipeline_trainer.cpp) report of a
// stage: its last step's spans as trace rows, and every stage's idle share and peak held inputs.
#pragma once

#include <string>

#include "app/reporter.h"
#include "app/trace.h"
#include "app/train_config.h"
#include "comm/communicator.h"
#include "pipeline/pipeline_stage.h"

namespace dtrain {

// Forwards and backwards on thread 0, transfer batches' waits on thread 1 (so the bubble shows).
void trace_pipeline_step(Tracer& tracer, const PipelineStage& stage);

// Collective over `world`: the note "pipeline: idle share per stage ..." with replica 0's stages
// (world ranks 0..P-1), beside (P-1)/(M+P-1), and their peak held inputs; and, with --metrics,
// one record of them: the step and epoch records are the last stage's (the loss is there), as
// data parallel's are rank 0's.
void report_pipeline_figures(Reporter& reporter, Communicator& world, const PipelineStage& stage,
                             const PipelineSettings& p);

// Collective over `world`: one fingerprint of the whole pipeline's parameters, every stage's
// parameters_fingerprint (replica 0's: world ranks 0..P-1) hashed in stage order, so a --json
// summary tells two pipeline runs apart by any stage's weights, not the last stage's alone.
uint64_t pipeline_fingerprint(Communicator& world, PipelineStage& stage, int stages);

}  // namespace dtrain
