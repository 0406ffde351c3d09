// Reading checkpoints back: resolving DIR/latest, checking state.json, every file's size and
// CRC-32, and the safetensors headers, then the config a resumed run must share. Every problem
// is one line naming the file or field. Reading opens files read-only and never changes DIR.
#pragma once

#include <filesystem>
#include <optional>
#include <span>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "checkpoint/training_state.h"

namespace dtrain::checkpoint {

struct LoadedCheckpoint {
  std::filesystem::path path;  // DIR/step-<N>
  TrainingState state;
  safetensors::File model;
  safetensors::File optimizer;
};

// The directory DIR/latest names; nullopt when DIR or DIR/latest does not exist (nothing to
// resume). Throws when `latest` is not one line "step-<N>" or names a directory that is absent:
// a damaged checkpoint directory is an error, never a silent fresh start.
std::optional<std::filesystem::path> find_latest(const std::filesystem::path& dir);

// `path` itself when it holds state.json, else the checkpoint its `latest` names; throws when
// it is neither.
std::filesystem::path resolve_checkpoint(const std::filesystem::path& path);

// Reads and validates the checkpoint at `path` (see resolve_checkpoint).
LoadedCheckpoint read_checkpoint(const std::filesystem::path& path);

// Throws "<path>/state.json: config.<field>: checkpoint <a>, this run <b>" for the first field
// (outside `may_differ`) where the checkpoint's config and `current` differ.
void check_config_matches(const LoadedCheckpoint& checkpoint, const nlohmann::json& current,
                          std::span<const std::string> may_differ);

}  // namespace dtrain::checkpoint
