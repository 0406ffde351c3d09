// `dtrain data shard --bytes PATH... -o DIR [--val-fraction F]`: byte-level llm.c token shards
// (vocabulary 256) from text files or folders, so that a user without a tokenizer can train a
// language model: the same files as shared/peers/llmc_shards.py writes (data/byte_shards.h).
// Needs no MPI job.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "data/byte_shards.h"

namespace dtrain {

struct DataShardConfig {
  std::vector<std::string> paths;     // text files or folders, in the order given
  std::string out_dir;
  std::optional<double> val_fraction;  // none: 1/20 of the bytes, at most 1 MiB (llmc_shards.py's rule)
};

struct ParsedDataShard {
  DataShardConfig config;
  bool help = false;
  std::string help_text;
};

// args excludes the program name and "data shard". Throws UsageError (one line naming the flag):
// --bytes missing, no PATH, no -o, --val-fraction outside (0, 1).
ParsedDataShard parse_data_shard_options(const std::vector<std::string>& args);

// Writes the shards and returns the summary line ("DIR: 95 train and 5 val tokens (bytes) ...").
// Throws Error (data/byte_shards.h's kinds).
std::string run_data_shard(const DataShardConfig& config);

}  // namespace dtrain
