// `dtrain sample --weights DIR|FILE --prompt TEXT --tokens N [--temperature T --top-k K --seed S]`:
// text from a byte-level GPT (vocabulary 256: token = byte). The model is rebuilt from the file's
// __metadata__ (dtrain.model=gpt, dtrain.layers/heads/embd/context/vocab, as `dtrain train --model
// gpt` writes them); a DIR is a checkpoint directory (its latest model.safetensors, as `dtrain
// eval` finds it). The prompt's bytes are the first tokens; each next token comes from the logits
// of the last position over a window of at most `context` tokens, scaled by 1/temperature (0:
// greedy), cut to the top k (0: all) and drawn with a counter-based generator seeded by --seed, so
// a seed gives the same text on every machine. Prints the prompt and the continuation.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "comm/runtime.h"
#include "model/gpt.h"

namespace dtrain {

struct SamplingSettings {
  float temperature = 1.f;  // 0: greedy (the largest logit; the lowest id among equals)
  int64_t top_k = 0;        // 0: every token
  uint64_t seed = 0;
};

struct SampleConfig {
  std::string weights;  // a safetensors file, a checkpoint (DIR/step-N) or a checkpoint directory
  std::string prompt;   // its bytes are the first tokens
  int64_t tokens = 0;   // how many to generate
  SamplingSettings sampling;
  RuntimeOptions runtime;
};

struct ParsedSample {
  SampleConfig config;
  bool help = false;
  std::string help_text;
};

// args excludes the program name and "sample". Throws UsageError (one line naming the flag).
ParsedSample parse_sample_options(const std::vector<std::string>& args);

// The byte-level GPT a file's metadata records (app/architecture.h reads it). Throws Error
// "<source>: ..." when it records none, another model, a bad value, or a vocabulary other than
// 256. Pure.
GptSpec sample_gpt_spec(const safetensors::Metadata& metadata, const std::string& source);

// Token `draw` (0, 1, ...) of a sampling run from one position's logits [V]: greedy at temperature
// 0, else softmax(logits / temperature) over the top_k largest (all when 0 or >= V; ties kept by
// the lower id) with the uniform number kernels::uniform01(seed, draw). Throws Error when a
// logit that could be chosen is not finite. Pure.
int32_t sample_token(std::span<const float> logits, const SamplingSettings& settings, uint64_t draw);

// Reads the weights (rank 0, broadcast), rebuilds the model, generates config.tokens tokens and
// prints the prompt and the continuation on rank 0. Returns the generated tokens. Throws
// AgreedError for weights that do not fit (a checkpoint error) or a model that is not byte-level.
std::vector<int32_t> run_sample(Runtime& runtime, const SampleConfig& config);

}  // namespace dtrain
