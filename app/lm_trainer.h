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

#include "app/checkpointing.h"
#include "app/reporter.h"
#include "app/train_config.h"
#include "checkpoint/training_state.h"
#include "comm/runtime.h"
#include "model/gpt.h"
#include "model/lr_schedule.h"

namespace dtrain {

TrainResult train_language_model(Runtime& runtime, const TrainConfig& config);

// Note [A language model's position] (app/lm_trainer.cpp): what state.json records of a run at
// optimizer step `step` having consumed `slots` training slots over all ranks (the pipeline's
// too, app/lm_pipeline_trainer.cpp); the loops add their own (DDP's buckets, the loss scale).
checkpoint::TrainingState lm_training_state(int64_t step, int64_t slots, const TrainConfig& config, int world_size,
                                            const StepLrSchedule& schedule);
// The notes of a run resumed from `resumed` at `world_size` ranks: where, and at another world
// size that it continues from the saved slot.
void note_lm_resume(Reporter& reporter, const ResumedRun& resumed, const TrainConfig& config, int world_size);

// The GPT that --layers, --heads, --embd and --context describe, over `vocab` token ids.
GptSpec gpt_spec(const LmSettings& lm, int64_t vocab);

}  // namespace dtrain
