// The checkpoint directory's names, `latest`, which checkpoints keep-K deletes, the fault
// setting, and state.json's encoding and config comparison: pure functions, no files.
#include "checkpoint/checkpoint_layout.h"

#include <gtest/gtest.h>

#include "checkpoint/training_state.h"
#include "core/error.h"

namespace dtrain::checkpoint {
namespace {

TEST(CheckpointLayout, StepNamesAreUnpaddedDecimals) {
  EXPECT_EQ(step_dir_name(120), "step-120");
  EXPECT_EQ(parse_step_dir_name("step-120"), 120);
  EXPECT_EQ(parse_step_dir_name("step-0"), 0);
  for (const char* bad : {"step-", "step-012", "step--1", "step-1x", "Step-1", "step-99999999999999999999", ".tmp-step-1"})
    EXPECT_EQ(parse_step_dir_name(bad), std::nullopt) << bad;
}

TEST(CheckpointLayout, LatestIsOneLine) {
  EXPECT_EQ(latest_content(7), "step-7\n");
  EXPECT_EQ(parse_latest("step-7\n"), 7);
  for (const char* bad : {"step-7", "step-7\n\n", " step-7\n", "step-7 \n", "", "\n"})
    EXPECT_EQ(parse_latest(bad), std::nullopt) << bad;
}

TEST(CheckpointLayout, KeepsTheNewestKAndNeverTheOneJustWritten) {
  EXPECT_EQ(steps_to_delete({10, 20, 30}, 30, 2), (std::vector<int64_t>{10}));
  EXPECT_EQ(steps_to_delete({10, 20, 30}, 30, 1), (std::vector<int64_t>{20, 10}));
  EXPECT_EQ(steps_to_delete({10, 20, 30}, 30, 5), (std::vector<int64_t>{}));
  EXPECT_EQ(steps_to_delete({30}, 30, 1), (std::vector<int64_t>{}));
  EXPECT_THROW(steps_to_delete({}, 1, 0), Error);
}

// A checkpoint is deleted only once a newer one is complete: steps above the one just written
// (an abandoned run's, or an older run's in the same folder) are never touched.
TEST(CheckpointLayout, NeverDeletesACheckpointNewerThanTheOneJustWritten) {
  // A fresh run saving step 4 into a folder holding step-8 and step-16 (issue 19, item 2).
  EXPECT_EQ(steps_to_delete({8, 16, 4}, 4, 2), (std::vector<int64_t>{}));
  EXPECT_EQ(steps_to_delete({8, 16, 4}, 4, 1), (std::vector<int64_t>{}));
  EXPECT_EQ(steps_to_delete({2, 8, 16, 4}, 4, 1), (std::vector<int64_t>{2}));
  // Resumed from step 10 with a step 30 of an abandoned run around: the new step 20 stays.
  EXPECT_EQ(steps_to_delete({10, 20, 30}, 20, 2), (std::vector<int64_t>{}));
  EXPECT_EQ(steps_to_delete({10, 20, 30}, 20, 1), (std::vector<int64_t>{10}));
}

TEST(CheckpointLayout, FaultSettingParses) {
  EXPECT_EQ(parse_fault_after_bytes(nullptr), std::nullopt);
  EXPECT_EQ(parse_fault_after_bytes(""), std::nullopt);
  EXPECT_EQ(parse_fault_after_bytes("0"), 0u);
  EXPECT_EQ(parse_fault_after_bytes("4096"), 4096u);
  EXPECT_THROW(parse_fault_after_bytes("4k"), Error);
  EXPECT_THROW(parse_fault_after_bytes("-1"), Error);
}

TrainingState sample_state() {
  TrainingState s;
  s.epoch = 2;
  s.step_in_epoch = 17;
  s.sample_in_epoch = 17 * 64 * 3;
  s.global_step = 1893;
  s.samples_seen = 121152;
  s.world_size = 3;
  s.seed = 18446744073709551615ull;
  s.rng = {{"loader", {1, 2, 3}}, {"dropout", "abc"}};
  s.lr_schedule_position = 2;
  s.lr = 0.1f * 0.1f;
  s.config = {{"batch_size", 64}};
  s.dtrain_version = "0.1.0";
  s.files["model.safetensors"] = {123, 0xdeadbeef};
  return s;
}

TEST(TrainingState, RoundTripsThroughJsonToTheBit) {
  const TrainingState s = sample_state();
  TrainingState back = decode_state(encode_state(s), "state.json");
  EXPECT_EQ(back.epoch, s.epoch);
  EXPECT_EQ(back.step_in_epoch, s.step_in_epoch);
  EXPECT_EQ(back.sample_in_epoch, s.sample_in_epoch);
  EXPECT_EQ(back.global_step, s.global_step);
  EXPECT_EQ(back.samples_seen, s.samples_seen);
  EXPECT_EQ(back.world_size, s.world_size);
  EXPECT_EQ(back.seed, s.seed);
  EXPECT_EQ(back.rng, s.rng);
  EXPECT_EQ(back.lr_schedule_position, s.lr_schedule_position);
  EXPECT_EQ(std::bit_cast<uint32_t>(back.lr), std::bit_cast<uint32_t>(s.lr));
  EXPECT_EQ(back.config, s.config);
  EXPECT_EQ(back.files, s.files);
  EXPECT_EQ(back.dtrain_version, "0.1.0");
}

TEST(TrainingState, KeepsTheFp16LossScaleAndLeavesItOutWithoutOne) {
  TrainingState s = sample_state();
  EXPECT_FALSE(nlohmann::json::parse(encode_state(s)).contains("grad_scaler")) << "no --amp fp16: no field";
  EXPECT_TRUE(decode_state(encode_state(s), "state.json").grad_scaler.is_null());
  s.grad_scaler = {{"scale", 0.0078125f}, {"growth_tracker", 1999}, {"skipped_steps", 12}};
  const TrainingState back = decode_state(encode_state(s), "state.json");
  EXPECT_EQ(back.grad_scaler, s.grad_scaler);
  EXPECT_EQ(back.grad_scaler["scale"].get<float>(), 0.0078125f);
}

std::string decode_error(nlohmann::json doc) {
  try {
    decode_state(doc.dump(), "d/state.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

// `doc` with its state_crc32 recomputed, as a writer of that content would have recorded it.
nlohmann::json signed_again(nlohmann::json doc) {
  doc["state_crc32"] = fmt::format("{:08x}", state_checksum(doc));
  return doc;
}

TEST(TrainingState, NamesTheFieldItRejects) {
  const nlohmann::json good = to_json(sample_state());
  auto with = [&](const char* key, nlohmann::json value) {
    nlohmann::json d = good;
    d[key] = value;
    return signed_again(d);
  };
  auto without = [&](const char* key) {
    nlohmann::json d = good;
    d.erase(key);
    return signed_again(d);
  };
  EXPECT_EQ(decode_error(with("format_version", 3)),
            "d/state.json: format_version: 3 is not a format this dtrain reads (it reads 1 to 2)");
  EXPECT_EQ(decode_error(without("epoch")), "d/state.json: epoch: missing");
  EXPECT_EQ(decode_error(with("world_size", 0)), "d/state.json: world_size: expected a whole number >= 1, got 0");
  EXPECT_EQ(decode_error(with("global_step", "12")), "d/state.json: global_step: expected a whole number >= 0, got \"12\"");
  EXPECT_EQ(decode_error(with("files", {{"model.safetensors", {{"bytes", 1}, {"crc32", "xyz"}}}})),
            "d/state.json: files.model.safetensors.crc32: expected 8 hex digits, got \"xyz\"");
  EXPECT_EQ(decode_error(with("checksum", "sha256")),
            "d/state.json: checksum: \"sha256\" is not a checksum this dtrain checks (it checks \"crc32\")");
  try {
    decode_state("{\"format_version\": ", "d/state.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_TRUE(std::string(e.what()).starts_with("d/state.json: not valid JSON: ")) << e.what();
  }
}

// Issue 19, item 5: one flipped value in state.json resumed silently into another run.
TEST(TrainingState, ChecksumCatchesAnyChangedValue) {
  const std::string text = encode_state(sample_state());
  EXPECT_NE(text.find("\"state_crc32\": \""), std::string::npos) << text;
  const std::vector<std::pair<std::string, std::string>> changes = {
      {"\"epoch\": 2", "\"epoch\": 3"},
      {"\"sample_in_epoch\": 3264", "\"sample_in_epoch\": 3265"},
      {"\"global_step\": 1893", "\"global_step\": 1892"},
      {"\"bytes\": 123", "\"bytes\": 122"}};
  for (const auto& [from, to] : changes) {
    std::string damaged = text;
    ASSERT_NE(damaged.find(from), std::string::npos) << from;
    damaged.replace(damaged.find(from), from.size(), to);
    try {
      decode_state(damaged, "d/state.json");
      ADD_FAILURE() << to << " was accepted";
    } catch (const Error& e) {
      EXPECT_TRUE(std::string(e.what()).starts_with("d/state.json: state_crc32: the document's CRC-32 is "))
          << e.what();
      EXPECT_TRUE(std::string(e.what()).ends_with("(state.json is damaged or was edited)")) << e.what();
    }
  }
  // Whitespace is not content: the checksum is over the compact form.
  EXPECT_EQ(decode_state(nlohmann::json::parse(text).dump(), "d/state.json").global_step, 1893);
  // Format 2 without its checksum is damaged, not old.
  nlohmann::json doc = nlohmann::json::parse(text);
  doc.erase("state_crc32");
  EXPECT_EQ(decode_error(doc), "d/state.json: state_crc32: missing");
  doc["state_crc32"] = 12345678;
  EXPECT_EQ(decode_error(doc), "d/state.json: state_crc32: expected 8 hex digits, got 12345678");
}

// Format 1 (before the checksum) is still read; one carrying a checksum anyway is checked.
TEST(TrainingState, ReadsFormatOneWithoutAChecksum) {
  nlohmann::json doc = to_json(sample_state());
  doc.erase("state_crc32");
  doc["format_version"] = 1;
  EXPECT_EQ(decode_state(doc.dump(2), "d/state.json").epoch, 2);
  doc = signed_again(doc);
  doc["epoch"] = 3;
  EXPECT_TRUE(decode_error(doc).starts_with("d/state.json: state_crc32: ")) << decode_error(doc);
}

TEST(TrainingState, FirstConfigDifferenceNamesTheField) {
  const nlohmann::json saved = {{"batch_size", 64}, {"epochs", 3}, {"model", {{"hidden", {256}}, {"name", "mlp"}}},
                                {"log_interval", 100}};
  const std::vector<std::string> may_differ = {"epochs", "log_interval"};
  nlohmann::json now = saved;
  now["epochs"] = 10;
  now["log_interval"] = 5;
  EXPECT_EQ(first_config_difference(saved, now, may_differ), std::nullopt);
  now["model"]["hidden"] = {128};
  now["batch_size"] = 32;
  EXPECT_EQ(first_config_difference(saved, now, may_differ), "batch_size: checkpoint 64, this run 32");
  now["batch_size"] = 64;
  EXPECT_EQ(first_config_difference(saved, now, may_differ), "model.hidden: checkpoint [256], this run [128]");
  now = saved;
  now["amp"] = "bf16";
  EXPECT_EQ(first_config_difference(saved, now, may_differ), "amp: checkpoint absent, this run \"bf16\"");
}

}  // namespace
}  // namespace dtrain::checkpoint
