// The language-model loop behind `dtrain train --model gpt`, llm.c's and nanoGPT's: --steps
// optimizer steps, each of --accumulate micro-batches of B sequences of T tokens per rank read
// from the token shards' slots (data/token_shards.h: global slot counter g = g0 + m*N + r), the
// GPT (model/gpt.h) -> cross-entropy -> DDP backward -> clipping by the global norm -> the
// per-step learning rate (warm-up, cosine) -> AdamW. The validation loss every --eval-every steps
// and at the end, over --eval-batches val slots shared by the ranks. Checkpoints and the stop vote
// through RunControl (app/run_control.h), as the image loop; a checkpoint's position is the
// optimizer step and g0, the slots consumed by all ranks, so a resumed run at any world size
// continues from slot g0, no slot skipped or repeated.
#pragma once

#include "app/train_config.h"
#include "comm/runtime.h"
#include "model/gpt.h"

namespace dtrain {

TrainResult train_language_model(Runtime& runtime, const TrainConfig& config);

// The GPT that --layers, --heads, --embd and --context describe, over `vocab` token ids.
GptSpec gpt_spec(const LmSettings& lm, int64_t vocab);

}  // namespace dtrain
