#include "checkpoint/training_state.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <set>

#include <fmt/format.h>

#include "checkpoint/durable_file.h"
#include "core/error.h"
#include "core/version.h"

namespace dtrain::checkpoint {

using nlohmann::json;

namespace {

[[noreturn]] void fail(std::string_view source, std::string_view field, const std::string& problem) {
  throw Error(fmt::format("{}: {}: {}", source, field, problem));
}

// A short rendering of a JSON value for an error line.
std::string brief(const json& value) {
  std::string text = value.dump();
  return text.size() > 60 ? text.substr(0, 57) + "..." : text;
}

const json& field(const json& doc, std::string_view name, std::string_view source) {
  auto it = doc.find(name);
  if (it == doc.end()) fail(source, name, "missing");
  return *it;
}

int64_t int_field(const json& doc, std::string_view name, std::string_view source, int64_t min = 0) {
  const json& v = field(doc, name, source);
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) ||
      v.get<int64_t>() < min)
    fail(source, name, fmt::format("expected a whole number >= {}, got {}", min, brief(v)));
  return v.get<int64_t>();
}

constexpr const char* kChecksum = "crc32";  // zlib's crc32(), as Python's zlib.crc32
constexpr const char* kStateChecksum = "state_crc32";  // the document's own, see the header
constexpr int64_t kFirstChecksummedFormat = 2;

std::string hex32(uint32_t value) { return fmt::format("{:08x}", value); }

std::optional<uint32_t> parse_hex32(const std::string& text) {
  uint32_t value = 0;
  if (text.size() != 8) return std::nullopt;
  auto [end, ec] = std::from_chars(text.data(), text.data() + 8, value, 16);
  if (ec != std::errc() || end != text.data() + 8) return std::nullopt;
  return value;
}

std::map<std::string, FileDigest> files_from_json(const json& doc, std::string_view source) {
  const json& files = field(doc, "files", source);
  if (!files.is_object()) fail(source, "files", "expected an object");
  std::map<std::string, FileDigest> out;
  for (const auto& [name, entry] : files.items()) {
    const std::string where = "files." + name;
    if (!entry.is_object()) fail(source, where, "expected an object");
    FileDigest digest;
    const json& bytes = field(entry, "bytes", source);
    if (!bytes.is_number_unsigned() && !(bytes.is_number_integer() && bytes.get<int64_t>() >= 0))
      fail(source, where + ".bytes", fmt::format("expected a byte count, got {}", brief(bytes)));
    digest.bytes = bytes.get<uint64_t>();
    const json& crc = field(entry, "crc32", source);
    auto value = crc.is_string() ? parse_hex32(crc.get<std::string>()) : std::nullopt;
    if (!value) fail(source, where + ".crc32", fmt::format("expected 8 hex digits, got {}", brief(crc)));
    digest.crc32 = *value;
    out[name] = digest;
  }
  return out;
}

std::optional<std::string> difference(const json& a, const json& b, const std::string& path,
                                      const std::set<std::string, std::less<>>& skip) {
  if (a.is_object() && b.is_object()) {
    std::set<std::string> keys;
    for (const auto& [k, v] : a.items()) keys.insert(k);
    for (const auto& [k, v] : b.items()) keys.insert(k);
    for (const std::string& k : keys) {
      const std::string sub = path.empty() ? k : path + "." + k;
      if (skip.contains(sub)) continue;
      const bool in_a = a.contains(k), in_b = b.contains(k);
      if (!in_a || !in_b)
        return fmt::format("{}: checkpoint {}, this run {}", sub, in_a ? brief(a[k]) : "absent",
                           in_b ? brief(b[k]) : "absent");
      if (auto d = difference(a[k], b[k], sub, skip)) return d;
    }
    return std::nullopt;
  }
  if (a == b) return std::nullopt;
  return fmt::format("{}: checkpoint {}, this run {}", path.empty() ? "config" : path, brief(a), brief(b));
}

}  // namespace

const char* dtrain_version() { return DTRAIN_VERSION; }

uint32_t state_checksum(const json& doc) {
  // Over the compact dump, keys sorted (nlohmann's objects are ordered maps): the value does not
  // depend on indentation, and numbers print as they parsed, so a document read back agrees.
  json without = doc;
  if (without.is_object()) without.erase(kStateChecksum);
  const std::string text = without.dump();
  return crc32_of(std::as_bytes(std::span(text)));
}

json to_json(const TrainingState& s) {
  json files = json::object();
  for (const auto& [name, d] : s.files) files[name] = {{"bytes", d.bytes}, {"crc32", hex32(d.crc32)}};
  json doc = {
      {"format_version", s.format_version},
      {"dtrain_version", s.dtrain_version},
      {"epoch", s.epoch},
      {"step_in_epoch", s.step_in_epoch},
      {"sample_in_epoch", s.sample_in_epoch},
      {"global_step", s.global_step},
      {"samples_seen", s.samples_seen},
      {"world_size", s.world_size},
      {"seed", s.seed},
      {"rng", s.rng},
      {"lr_schedule_position", s.lr_schedule_position},
      {"lr", s.lr},
      {"config", s.config.is_null() ? json::object() : s.config},
      {"optimizer_shards", s.optimizer_shards},
      {"checksum", kChecksum},
      {"files", files},
  };
  if (!s.buckets.is_null()) doc["buckets"] = s.buckets;
  if (!s.grad_scaler.is_null()) doc["grad_scaler"] = s.grad_scaler;
  if (s.pipeline_stages != 1) doc["pipeline_stages"] = s.pipeline_stages;
  doc[kStateChecksum] = hex32(state_checksum(doc));
  return doc;
}

TrainingState training_state_from_json(const json& doc, std::string_view source) {
  if (!doc.is_object()) throw Error(fmt::format("{}: not a JSON object", source));
  TrainingState s;
  s.format_version = int_field(doc, "format_version", source);
  if (s.format_version < kOldestFormatVersion || s.format_version > kFormatVersion)
    fail(source, "format_version", fmt::format("{} is not a format this dtrain reads (it reads {} to {})",
                                               s.format_version, kOldestFormatVersion, kFormatVersion));
  if (s.format_version >= kFirstChecksummedFormat || doc.contains(kStateChecksum)) {
    const json& recorded = field(doc, kStateChecksum, source);
    auto value = recorded.is_string() ? parse_hex32(recorded.get<std::string>()) : std::nullopt;
    if (!value) fail(source, kStateChecksum, fmt::format("expected 8 hex digits, got {}", brief(recorded)));
    if (const uint32_t crc = state_checksum(doc); crc != *value)
      fail(source, kStateChecksum,
           fmt::format("the document's CRC-32 is {}, it records {} (state.json is damaged or was edited)", hex32(crc),
                       hex32(*value)));
  }
  const json& version = field(doc, "dtrain_version", source);
  if (!version.is_string()) fail(source, "dtrain_version", "expected a string");
  s.dtrain_version = version.get<std::string>();
  s.epoch = int_field(doc, "epoch", source);
  s.step_in_epoch = int_field(doc, "step_in_epoch", source);
  s.sample_in_epoch = int_field(doc, "sample_in_epoch", source);
  s.global_step = int_field(doc, "global_step", source);
  s.samples_seen = int_field(doc, "samples_seen", source);
  s.world_size = int_field(doc, "world_size", source, 1);
  const json& seed = field(doc, "seed", source);
  if (!seed.is_number_unsigned() && !(seed.is_number_integer() && seed.get<int64_t>() >= 0))
    fail(source, "seed", fmt::format("expected a whole number, got {}", brief(seed)));
  s.seed = seed.get<uint64_t>();
  s.rng = field(doc, "rng", source);
  s.lr_schedule_position = int_field(doc, "lr_schedule_position", source);
  const json& lr = field(doc, "lr", source);
  if (!lr.is_number()) fail(source, "lr", fmt::format("expected a number, got {}", brief(lr)));
  s.lr = lr.get<float>();
  s.config = field(doc, "config", source);
  if (!s.config.is_object()) fail(source, "config", "expected an object");
  s.optimizer_shards = int_field(doc, "optimizer_shards", source, 1);
  const json& checksum = field(doc, "checksum", source);
  if (checksum != kChecksum)
    fail(source, "checksum", fmt::format("{} is not a checksum this dtrain checks (it checks \"{}\")", brief(checksum), kChecksum));
  s.files = files_from_json(doc, source);
  if (doc.contains("buckets")) s.buckets = doc["buckets"];
  if (doc.contains("grad_scaler")) s.grad_scaler = doc["grad_scaler"];
  // Absent: a data-parallel run's, or an older dtrain's (whose pipelines saved no layout).
  if (doc.contains("pipeline_stages")) s.pipeline_stages = int_field(doc, "pipeline_stages", source, 1);
  return s;
}

std::string encode_state(const TrainingState& state) { return to_json(state).dump(2) + "\n"; }

TrainingState decode_state(std::string_view text, std::string_view source) {
  json doc;
  try {
    doc = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    std::string what = e.what();
    if (auto close = what.find("] "); close != std::string::npos) what.erase(0, close + 2);
    throw Error(fmt::format("{}: not valid JSON: {}", source, what));
  }
  return training_state_from_json(doc, source);
}

std::optional<std::string> first_config_difference(const json& checkpoint, const json& current,
                                                   std::span<const std::string> may_differ) {
  const std::set<std::string, std::less<>> skip(may_differ.begin(), may_differ.end());
  return difference(checkpoint, current, "", skip);
}

}  // namespace dtrain::checkpoint
