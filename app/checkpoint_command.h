// `dtrain checkpoint consolidate DIR [-o FILE]`: the full optimizer state of a sharded checkpoint
// (Note [Sharded optimizer state] in checkpoint/checkpoint_layout.h) as one file laid out as an
// unsharded save's optimizer.safetensors, written tensor by tensor (never the whole state in
// memory). Needs no MPI job.
#pragma once

#include <string>
#include <vector>

namespace dtrain {

struct ConsolidateConfig {
  std::string dir;   // a checkpoint (DIR/step-<N>) or a checkpoint folder (its newest)
  std::string out = "optimizer.safetensors";
};

struct ParsedConsolidate {
  ConsolidateConfig config;
  bool help = false;
  std::string help_text;
};

// args excludes the program name and "checkpoint consolidate". Throws UsageError (one line).
ParsedConsolidate parse_consolidate_options(const std::vector<std::string>& args);

// Writes the file and returns the summary line ("FILE: the optimizer state of DIR/step-8 from 3
// shards: 6 tensors, 3 counts, 1234 bytes"). Throws Error: kCheckpoint for a damaged checkpoint,
// kUsage for one whose state is not sharded, kOutput when FILE cannot be written.
std::string run_consolidate(const ConsolidateConfig& config);

}  // namespace dtrain
