// `dtrain eval --weights FILE.safetensors|CHECKPOINT [--data DIR] [--test-limit N] [flags]`:
// the test-set loss and accuracy of given weights, as the seeds' `Test set:` line, on as many
// ranks as it was started with (the test set sharded, the sums all-reduced). The architecture
// comes from the file's __metadata__ (app/architecture.h); a --model, --hidden, --dropout or
// --normalize flag that disagrees with it is an error, and they describe files that record none.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "app/architecture.h"
#include "app/evaluate.h"
#include "app/train_config.h"
#include "comm/runtime.h"

namespace dtrain {

// What the flags say about the architecture; nullopt where a flag was not given.
struct ArchitectureFlags {
  std::optional<ModelKind> model;
  std::optional<std::vector<int64_t>> hidden;
  std::optional<float> dropout;
  std::optional<Normalize> normalize;
};

struct EvalConfig {
  std::string weights;  // a safetensors file, a checkpoint (DIR/step-N) or a checkpoint directory
  std::string data_dir = DataSettings{}.dir;
  int64_t test_limit = 0;
  // GPT weights only: validation slots (0: all) and sequences per slot (nullopt: 8, the trainer's
  // default for gpt).
  int64_t eval_batches = 0;
  std::optional<int64_t> batch_size;
  bool model_gpt = false;  // --model gpt: only with GPT weights
  ArchitectureFlags flags;
  RuntimeOptions runtime;
};

struct ParsedEval {
  EvalConfig config;
  bool help = false;
  std::string help_text;
};

// args excludes the program name and "eval". Throws UsageError (one line naming the flag).
ParsedEval parse_eval_options(const std::vector<std::string>& args);

// The architecture to build: the one `recorded` in the file, where every flag given agrees with
// it, else the flags' (defaults for those not given: the seeds' MLP). Throws Error "<source>:
// --hidden 512 disagrees with the weights (recorded: 256)". Pure.
Architecture resolve_architecture(const std::optional<Architecture>& recorded, const ArchitectureFlags& flags,
                                  const Shape& input_shape, int classes, const std::string& source);

// Reads the weights (rank 0, broadcast), builds the model, evaluates it and prints the `Test
// set:` line on rank 0 (for a GPT: "val loss 2.781234 | perplexity 16.14 | 4 slots of 8x256
// tokens"; Evaluation::loss is that loss, samples the slots). Throws AgreedError for a file or flags that do not fit.
Evaluation run_eval(Runtime& runtime, const EvalConfig& config);

}  // namespace dtrain
