// Reading checkpoints back: resolving DIR/latest (or, without it, the newest complete step-<N>),
// checking state.json and its checksum, every file's size and CRC-32, and the safetensors
// headers, then the config a resumed run must share. Every problem is one line naming the file
// or field. Reading opens files read-only and never changes DIR.
#pragma once

#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/optimizer_shards.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/training_state.h"

namespace dtrain::checkpoint {

struct LoadedCheckpoint {
  std::filesystem::path path;  // DIR/step-<N>
  TrainingState state;
  safetensors::File model;
  // Opened and checked, not read into memory (one file, or state.optimizer_shards shards).
  OptimizerFiles optimizer;
  // Why this one, when DIR had no `latest` to say: "DIR has no latest; using DIR/step-16, the
  // newest complete checkpoint" (and any newer one skipped, with the reason). Empty otherwise.
  std::string chosen_because;
};

// The directory DIR/latest names; nullopt when DIR or DIR/latest does not exist. Throws when
// `latest` is not one line "step-<N>" or names a directory that is absent: a damaged checkpoint
// directory is an error, never a silent fresh start.
std::optional<std::filesystem::path> find_latest(const std::filesystem::path& dir);

// The step-<N> directories in `dir`, newest first (none when `dir` does not exist).
std::vector<int64_t> list_steps(const std::filesystem::path& dir);

// The checkpoint of directory `dir`: the one `latest` names, else (no `latest`) the newest
// step-<N> that reads back complete, damaged ones skipped (see chosen_because). nullopt when
// `dir` holds neither `latest` nor any step-<N> (nothing to resume). Throws for a `latest` that
// find_latest rejects or a checkpoint it names that is damaged, and when there are step-<N>
// directories but none is complete (naming each one's problem).
std::optional<LoadedCheckpoint> read_newest(const std::filesystem::path& dir);

// Reads and validates the checkpoint at `path`: `path` itself when it holds state.json, else
// read_newest(path); throws when it is neither a checkpoint nor a directory holding one.
LoadedCheckpoint read_checkpoint(const std::filesystem::path& path);

// Throws "<path>/state.json: config.<field>: checkpoint <a>, this run <b>" for the first field
// (outside `may_differ`) where the checkpoint's config and `current` differ.
void check_config_matches(const LoadedCheckpoint& checkpoint, const nlohmann::json& current,
                          std::span<const std::string> may_differ);

}  // namespace dtrain::checkpoint
