// state.json: where training stands (counters, RNG, LR-schedule position), the settings that
// must not change on resume, the size and CRC-32 of every other file of the checkpoint, and
// its own CRC-32 ("state_crc32": zlib's crc32 of the compact JSON, keys sorted, of the document
// without that field), so that a flipped bit in a counter is an error, not another run.
// Written and read with nlohmann-json; the reader checks each field's presence and type and
// names the field it rejects. Also the resume-compatibility check of two configs.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>

#include <nlohmann/json.hpp>

namespace dtrain::checkpoint {

// Bumped when a reader of the old format could not read the new one correctly. 2: state.json
// carries "state_crc32", its own checksum. Format 1 (no checksum) is still read: a damaged
// version 2 cannot pass for 1 (no single bit turns '2' into '1', and the checksum covers it).
inline constexpr int64_t kFormatVersion = 2;
inline constexpr int64_t kOldestFormatVersion = 1;

// Size and checksum of one file of the checkpoint; crc32 is zlib's (Python: zlib.crc32).
struct FileDigest {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
  bool operator==(const FileDigest&) const = default;
};

struct TrainingState {
  // Filled by the trainer.
  int64_t epoch = 0;            // the epoch to continue (counts from 0)
  int64_t step_in_epoch = 0;    // optimizer steps of that epoch already done
  int64_t sample_in_epoch = 0;  // global samples of that epoch already used: the position in the
                                // epoch's sample order where it continues (at any world size)
  int64_t global_step = 0;      // optimizer steps since the start: the N of step-<N>
  int64_t samples_seen = 0;     // global samples consumed, over all ranks
  int64_t world_size = 1;
  int64_t pipeline_stages = 1;  // P of the P x D grid (world_size / P replicas); written only when
                                // > 1, so a data-parallel run's state.json is as before
  uint64_t seed = 0;
  nlohmann::json rng;           // opaque to this layer: the trainer's RNG state(s)
  int64_t lr_schedule_position = 0;  // the schedule's position (epochs for the per-epoch schedules)
  float lr = 0.f;               // the learning rate in effect (a float round-trips exactly)
  nlohmann::json config;        // settings that must not change on resume (an object)
  nlohmann::json buckets;       // opaque to this layer: DDP's bucket layout once chosen (null before,
                                // and in checkpoints of older dtrains: then it is chosen again)
  nlohmann::json grad_scaler;   // opaque to this layer: the fp16 loss scale's state (null without
                                // --amp fp16)
  // Filled by the writer.
  int64_t format_version = kFormatVersion;
  std::string dtrain_version;
  int64_t optimizer_shards = 1;  // Note [Sharded optimizer state]
  std::map<std::string, FileDigest> files;  // file name in the step directory -> digest
};

nlohmann::json to_json(const TrainingState& state);  // with its state_crc32
// The CRC-32 that `doc`'s "state_crc32" must hold (computed without that field).
uint32_t state_checksum(const nlohmann::json& doc);
// Throws Error "<source>: <field>: <problem>" (one line); `format_version` is checked first so
// a newer format is reported as such rather than as a missing field, then the checksum.
TrainingState training_state_from_json(const nlohmann::json& doc, std::string_view source);
std::string encode_state(const TrainingState& state);  // pretty JSON, newline-terminated
TrainingState decode_state(std::string_view text, std::string_view source);

// The first difference between a checkpoint's config and this run's, as "batch_size:
// checkpoint 64, this run 32" (nested fields dotted: "model.hidden"); a field missing on one
// side reads "absent". Fields named in `may_differ` (dotted paths) are skipped. Objects are
// compared key by key in sorted order; any other values must be equal as JSON.
std::optional<std::string> first_config_difference(const nlohmann::json& checkpoint, const nlohmann::json& current,
                                                   std::span<const std::string> may_differ);

// The compiled-in dtrain version ("0.1.0").
const char* dtrain_version();

}  // namespace dtrain::checkpoint
