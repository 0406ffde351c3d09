// The GPT cut into pipeline stages (Note [GPT pipeline stages] in model/gpt.h): the layers are
// the embeddings, the L blocks and the head (ln_f and the output layer tied to wte), L + 2 in
// all; stage 0 holds the embeddings, the last stage the head, every stage at least one layer.
#pragma once

#include <memory>
#include <vector>

#include "model/gpt.h"
#include "model/sequential.h"
#include "pipeline/partition.h"

namespace dtrain {

// Balanced by parameter count (the head counts its copy of wte), or at `split` (the first layer
// of stages 1..P-1; layer 0 is the embeddings, layer i the block i - 1). Throws one line.
std::vector<StageRange> gpt_stage_ranges(const GptSpec& spec, int stages, const std::vector<size_t>& split);

// Stage `range`'s layers alone, with the unsplit GPT's names and initial weights from `seed`.
std::unique_ptr<Sequential> build_gpt_stage(const GptSpec& spec, Device device, uint64_t seed, StageRange range);

// The sizes of stage `range`'s layers (plan_gpt_layers), for the per-stage memory check.
std::vector<LayerSize> plan_gpt_stage(const GptSpec& spec, StageRange range);

}  // namespace dtrain
