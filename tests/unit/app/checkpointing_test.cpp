// What a checkpoint records about the run: the config a resumed run must share (every setting
// that changes results is in it, the ones that may change are not), the architecture in
// model.safetensors' __metadata__ and how `dtrain eval` reconciles it with its flags; the
// checkpoint and resume flags.
#include <gtest/gtest.h>

#include "app/architecture.h"
#include "app/checkpointing.h"
#include "app/eval_command.h"
#include "app/preemption.h"
#include "app/train_options.h"
#include "checkpoint/training_state.h"
#include "core/error.h"

namespace dtrain {
namespace {

nlohmann::json config_of(std::vector<std::string> args) {
  args.insert(args.begin(), {"--data", "/tmp"});
  return resume_config(parse_train_options(args).config);
}

std::string difference(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  return checkpoint::first_config_difference(config_of(a), config_of(b), {}).value_or("(none)");
}

TEST(ResumeConfig, EverySettingThatChangesResultsMustMatch) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--model", "cnn"}, "model.architecture"},      {{"--hidden", "128"}, "model.hidden"},
      {{"--dropout", "0.1"}, "model.dropout"},          {{"--optimizer", "adamw"}, "optimizer.algorithm"},
      {{"--lr", "0.02"}, "optimizer.lr"},               {{"--momentum", "0.5"}, "optimizer.momentum"},
      {{"--nesterov"}, "optimizer.nesterov"},           {{"--weight-decay", "0.1"}, "optimizer.weight_decay"},
      {{"--lr-schedule", "step"}, "lr_schedule.kind"},  {{"--batch-size", "32"}, "batch_size"},
      {{"--accumulate", "2"}, "accumulate"},            {{"--amp", "bf16"}, "amp"},
      {{"--comm-hook", "fp16"}, "ddp.comm_hook"},       {{"--bucket-cap-mb", "1"}, "ddp.bucket_cap_bytes"},
      {{"--normalize", "0.5,0.5"}, "data.normalize"},   {{"--shuffle", "off"}, "data.shuffle"},
      {{"--train-limit", "100"}, "data.train_limit"},   {{"--test-limit", "100"}, "data.test_limit"},
      {{"--seed", "3"}, "seed"},
  };
  for (const auto& [flags, field] : cases) {
    const std::string d = difference({}, flags);
    EXPECT_EQ(d.substr(0, d.find(':')), field) << flags[0] << ": " << d;
  }
}

// --classes is part of the model, recorded only when given: checkpoints of runs without it (and
// of older dtrains) still match a run without it.
TEST(ResumeConfig, ClassesAreRecordedOnlyWhenGiven) {
  EXPECT_FALSE(config_of({})["model"].contains("classes"));
  EXPECT_EQ(config_of({"--classes", "12"})["model"]["classes"], 12);
  EXPECT_EQ(difference({"--classes", "12"}, {}), "model.classes: checkpoint 12, this run absent");
  EXPECT_EQ(difference({"--classes", "12"}, {"--classes", "12"}), "(none)");
}

TEST(ResumeConfig, AutoBucketCapIsASettingOfItsOwn) {
  EXPECT_EQ(difference({"--bucket-cap-mb", "auto"}, {}), "ddp.bucket_cap_bytes: checkpoint \"auto\", this run 26214400");
  EXPECT_EQ(difference({"--bucket-cap-mb", "auto"}, {"--bucket-cap-mb", "auto"}), "(none)");
}

TEST(BucketLayoutJson, RoundTripsThroughStateJson) {
  checkpoint::TrainingState state;
  state.buckets = bucket_layout_json({{2, 0, 1}, 1u << 20, 4u << 20});
  const checkpoint::TrainingState back = checkpoint::decode_state(checkpoint::encode_state(state), "state.json");
  EXPECT_EQ(bucket_layout_from_json(back.buckets, 3, "state.json"), (BucketLayout{{2, 0, 1}, 1u << 20, 4u << 20}));
  // No layout yet (saved before step 1, or by an older dtrain): no field, chosen again on resume.
  EXPECT_FALSE(checkpoint::to_json(checkpoint::TrainingState{}).contains("buckets"));
  EXPECT_TRUE(checkpoint::decode_state(checkpoint::encode_state({}), "state.json").buckets.is_null());
}

// Note [Resume layout]: the grid a checkpoint was saved on round-trips through state.json (absent
// at P = 1, as older checkpoints have it), and a resume on another grid is noted even at the same
// world size.
TEST(ResumeLayout, TheSameWorldSizeCutIntoOtherStagesIsAnotherLayout) {
  checkpoint::TrainingState saved;
  saved.world_size = 2;
  EXPECT_FALSE(checkpoint::to_json(saved).contains("pipeline_stages"));
  saved.pipeline_stages = 2;
  saved = checkpoint::decode_state(checkpoint::encode_state(saved), "state.json");
  EXPECT_EQ(saved.pipeline_stages, 2);
  EXPECT_EQ(layout_change(saved, 2, 2), std::nullopt);
  const std::optional<LayoutChange> to_p1 = layout_change(saved, 2, 1);  // P 2 x D 1 -> P 1 x D 2
  ASSERT_TRUE(to_p1.has_value());
  EXPECT_EQ(to_p1->saved, "2 (P 2 x D 1)");
  EXPECT_EQ(to_p1->running, "2 (P 1 x D 2)");
  EXPECT_EQ(image_resume_layout_note(saved, 2, 1).rfind("resume: saved at world size 2 (P 2 x D 1), running at 2 (P "
                                                         "1 x D 2): the rest of epoch 1",
                                                         0),
            0u);
  EXPECT_EQ(image_resume_layout_note(saved, 2, 2), "");
  // Data-parallel runs only: the world size alone, as before.
  checkpoint::TrainingState dp;
  dp.world_size = 4;
  EXPECT_EQ(layout_change(dp, 4, 1), std::nullopt);
  const std::optional<LayoutChange> to_2 = layout_change(dp, 2, 1);
  ASSERT_TRUE(to_2.has_value());
  EXPECT_EQ(to_2->saved + " -> " + to_2->running, "4 -> 2");
  EXPECT_EQ(layout_change(dp, 4, 2).value().saved, "4 (P 1 x D 4)");
}

TEST(BucketLayoutJson, ALayoutThatDoesNotFitTheModelIsOneLineNamingTheField) {
  auto error_of = [](const nlohmann::json& j) {
    try {
      bucket_layout_from_json(j, 3, "ck/state.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  const nlohmann::json good = bucket_layout_json({{2, 1, 0}, 1, 2});
  nlohmann::json j = good;
  j["ready_order"] = {2, 1};
  EXPECT_EQ(error_of(j), "ck/state.json: buckets.ready_order: 2 parameter indices for a model of 3 parameters");
  j = good;
  j["ready_order"] = {2, 1, "x"};
  EXPECT_EQ(error_of(j), "ck/state.json: buckets.ready_order: \"x\" is not a parameter index");
  j = good;
  j["bucket_cap_bytes"] = 0;
  EXPECT_EQ(error_of(j), "ck/state.json: buckets.bucket_cap_bytes: expected a positive whole number");
  EXPECT_EQ(error_of(nlohmann::json::array()), "ck/state.json: buckets: expected an object");
  EXPECT_EQ(error_of(good), "(accepted)");
}

// A position past the epoch's end (a checkpoint of a larger data set) names state.json (66), not
// the sampler's internal bound (1, retried by dtrain-launch).
TEST(ResumePosition, APositionPastTheEpochNamesTheStateFile) {
  checkpoint::TrainingState s;
  s.epoch = 1;
  s.sample_in_epoch = 64;
  EXPECT_EQ(position_of(s, 64, "ck/state.json").sample_in_epoch, 64);  // the epoch's end: its last step was saved
  s.sample_in_epoch = 65;
  try {
    position_of(s, 64, "ck/state.json");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCheckpoint);
    EXPECT_EQ(std::string(e.what()), "ck/state.json: sample_in_epoch 65 is past the end of an epoch of the 64 "
                                     "training samples (a checkpoint of other data?)");
  }
}

TEST(ResumeConfig, AdamWsEpsMustMatch) {
  EXPECT_EQ(difference({"--optimizer", "adamw"}, {"--optimizer", "adamw", "--adam-eps", "1e-6"}),
            "optimizer.eps: checkpoint 1e-08, this run 1e-06");
}

TEST(ResumeConfig, ALargerEpochCountAndOutputSettingsMayChange) {
  EXPECT_EQ(difference({"--epochs", "2"}, {"--epochs", "5", "--log-interval", "7", "--json", "--quiet", "--device",
                                           "cpu", "--threads", "1", "--checkpoint-every", "9", "--keep", "4",
                                           "--find-unused-parameters", "--trace", "t.json"}),
            "(none)");
  EXPECT_EQ(difference({"--lr-schedule", "step", "--epochs", "2"}, {"--lr-schedule", "step", "--epochs", "5"}), "(none)");
  // A cosine schedule's period is its epoch count: changing it changes every learning rate.
  EXPECT_EQ(difference({"--lr-schedule", "cosine", "--epochs", "2"}, {"--lr-schedule", "cosine", "--epochs", "5"}),
            "lr_schedule.period_epochs: checkpoint 2, this run 5");
}

TEST(ResumeConfig, ShowsWhatTheUserTyped) {
  EXPECT_EQ(difference({"--lr", "0.01"}, {"--lr", "0.02"}), "optimizer.lr: checkpoint 0.01, this run 0.02");
}

Architecture seed_mlp() {
  Architecture a;
  a.model.kind = ModelKind::kMlp;
  a.model.hidden = {256};
  a.input_shape = {1, 28, 28};
  a.classes = 10;
  return a;
}

TEST(Architecture, RoundTripsThroughMetadata) {
  Architecture a = seed_mlp();
  a.model.hidden = {512, 128};
  a.model.dropout = 0.25f;
  a.normalize = {0.286f, 0.353f};
  const safetensors::Metadata m = architecture_metadata(a);
  EXPECT_EQ(m.at("format"), "pt");
  EXPECT_EQ(m.at("dtrain.hidden"), "512,128");
  const std::optional<Architecture> b = architecture_from_metadata(m, "f");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->model.kind, a.model.kind);
  EXPECT_EQ(b->model.hidden, a.model.hidden);
  EXPECT_EQ(b->model.dropout, a.model.dropout);
  EXPECT_EQ(b->input_shape, a.input_shape);
  EXPECT_EQ(b->classes, 10);
  EXPECT_EQ(b->normalize.mean, a.normalize.mean);  // exactly: floats are written to round-trip
  EXPECT_EQ(b->normalize.std, a.normalize.std);
  EXPECT_FALSE(architecture_from_metadata({{"format", "pt"}}, "f"));  // written elsewhere: none recorded
}

TEST(Architecture, ABadRecordNamesTheKey) {
  safetensors::Metadata m = architecture_metadata(seed_mlp());
  m["dtrain.hidden"] = "256,x";
  EXPECT_THROW(
      {
        try {
          architecture_from_metadata(m, "w.safetensors");
        } catch (const Error& e) {
          EXPECT_STREQ(e.what(), "w.safetensors: __metadata__ dtrain.hidden: expected positive whole numbers, comma "
                                 "separated, got '256,x'");
          throw;
        }
      },
      Error);
}

std::string resolve_error(const ArchitectureFlags& flags) {
  try {
    resolve_architecture(seed_mlp(), flags, {1, 28, 28}, 10, "w");
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

ArchitectureFlags hidden_flag(std::vector<int64_t> widths) {
  ArchitectureFlags f;
  f.hidden = std::move(widths);
  return f;
}

TEST(EvalArchitecture, FlagsThatDisagreeWithTheFileAreAnError) {
  EXPECT_EQ(resolve_error({}), "(accepted)");
  EXPECT_EQ(resolve_error(hidden_flag({256})), "(accepted)");
  EXPECT_EQ(resolve_error(hidden_flag({512})), "w: --hidden 512 disagrees with the weights (recorded: 256)");
  ArchitectureFlags cnn;
  cnn.model = ModelKind::kCnn;
  EXPECT_EQ(resolve_error(cnn), "w: --model cnn disagrees with the weights (recorded: mlp)");
  ArchitectureFlags normalize;
  normalize.normalize = Normalize{0.5f, 0.5f};
  EXPECT_EQ(resolve_error(normalize), "w: --normalize 0.5,0.5 disagrees with the weights (recorded: 0,1)");
  // A file that records nothing is described by the flags.
  const Architecture a = resolve_architecture(std::nullopt, hidden_flag({64, 32}), {1, 28, 28}, 10, "w");
  EXPECT_EQ(a.model.hidden, (std::vector<int64_t>{64, 32}));
}

TEST(CheckpointOptions, Parse) {
  const TrainConfig c = parse_train_options({"--data", "/tmp", "--checkpoint-dir", "ck", "--checkpoint-every", "50",
                                             "--keep", "3", "--resume", "auto", "--init-weights", "w.safetensors",
                                             "--checkpoint-sync", "--shuffle", "off"})
                            .config;
  EXPECT_EQ(c.checkpoints.dir, "ck");
  EXPECT_EQ(c.checkpoints.every, 50);
  EXPECT_EQ(c.checkpoints.keep, 3);
  EXPECT_EQ(c.checkpoints.resume, ResumeMode::kAuto);
  EXPECT_EQ(c.checkpoints.init_weights, "w.safetensors");
  EXPECT_FALSE(c.checkpoints.background);
  EXPECT_FALSE(c.data.shuffle);
  const TrainConfig d = parse_train_options({"--data", "/tmp", "--resume", "ck/step-40"}).config;
  EXPECT_EQ(d.checkpoints.resume, ResumeMode::kPath);
  EXPECT_EQ(d.checkpoints.resume_path, "ck/step-40");
  EXPECT_TRUE(d.checkpoints.background);
  EXPECT_TRUE(d.data.shuffle);
  EXPECT_THROW(parse_train_options({"--data", "/tmp", "--resume", "auto"}), UsageError);
  EXPECT_THROW(parse_train_options({"--data", "/tmp", "--checkpoint-every", "-1"}), UsageError);
}

TEST(StopVote, VotesAboutOncePerPeriod) {
  EXPECT_EQ(vote_interval(1.0, 50), 50);      // 1 ms steps: every 50th boundary
  EXPECT_EQ(vote_interval(200.0, 50), 1);     // slow steps: every boundary
  EXPECT_EQ(vote_interval(0.0, 50), 1);       // nothing measured yet
  EXPECT_EQ(vote_interval(1.0, 0), 1);        // period 0: every boundary
  EXPECT_EQ(vote_interval(1e-6, 50), kMaxVoteInterval);
}

}  // namespace
}  // namespace dtrain
