// `dtrain train --model gpt --pipeline-stages P`: the language-model loop of app/lm_trainer.h
// (token shards, --steps, warm-up and cosine, AdamW, --clip-grad-norm, --eval-every) over the
// GPT cut into P stages on a P x D grid (pipeline/gpt_stage.h, Note [GPT pipeline stages] in
// model/gpt.h). Replica d reads slots g0 + a x D + d (a < --accumulate A) of B sequences per step
// (the data-parallel loop's slot order, so D replicas of B read what D ranks of B would), each cut
// into --micro-batches; the loss is the mean over the A x D x B sequences (Note [Pipeline loss]).
// The log lines are the data-parallel loop's, printed by the last stage of replica 0 (world rank
// P - 1).
#pragma once

#include "app/train_config.h"
#include "comm/runtime.h"

namespace dtrain {

TrainResult train_language_model_pipeline(Runtime& runtime, const TrainConfig& config);

}  // namespace dtrain
