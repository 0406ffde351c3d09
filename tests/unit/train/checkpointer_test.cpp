// The library's Checkpointer (train/checkpointer.h) on a job of one rank: a save and a restore
// give back the model, the optimizer state, the Dropout counters and the caller's state to the
// bit; what does not fit (a config that differs, a non-finite value, a directory in use) is an
// AgreedError, and nothing of the refused step is written.
#include "train/checkpointer.h"

#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../data/temp_dir.h"
#include "comm/self_communicator.h"
#include "model/models.h"
#include "train/root_broadcast.h"

namespace dtrain {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

std::unique_ptr<Sequential> small_model(uint64_t seed, float dropout = 0.f) {
  ModelSpec spec;
  spec.hidden = {8};
  spec.dropout = dropout;
  spec.memory_budget_bytes = 1 << 30;
  return build_model(spec, {1, 28, 28}, 10, Device::cpu(), seed);
}

// One SGD step with made-up gradients, so that the momentum buffers hold something.
void take_a_step(Sequential& model, Optimizer& optimizer) {
  for (Parameter* p : model.parameters()) {
    p->grad_is_zero = false;
    for (int64_t i = 0; i < p->grad.numel(); ++i) p->grad.data()[i] = 0.001f * static_cast<float>(i % 17) - 0.008f;
  }
  optimizer.step();
}

std::vector<std::vector<float>> values(Sequential& model) {
  std::vector<std::vector<float>> v;
  for (Parameter* p : model.parameters()) v.push_back(p->value.to_vector());
  return v;
}

std::vector<std::vector<float>> values(const OptimizerState& state) {
  std::vector<std::vector<float>> v;
  for (const auto& e : state.tensors) v.push_back(e.value.to_vector());
  return v;
}

// NaN weights can give a finite loss: the snapshot a save takes is checked before the vote, and a
// discarded snapshot writes nothing.
TEST(Checkpointer, TheSnapshotNamesANonFiniteValueAndADiscardedOneWritesNothing) {
  testing::TempDir tmp;
  const std::string dir = (tmp.path() / "ck").string();
  SelfCommunicator control;  // a job of one rank: the writer
  Checkpointer saver(control, {.dir = dir, .background = false});
  std::unique_ptr<Sequential> model = small_model(0);
  std::unique_ptr<Optimizer> optimizer = make_optimizer(OptimizerSpec{}, model->parameters());
  checkpoint::TrainingState state;
  state.global_step = 1;
  EXPECT_EQ(saver.snapshot(state, *model, *optimizer, {}), "");
  saver.write();
  EXPECT_EQ(saver.last_path(), dir + "/step-1");
  model->parameters()[2]->value.data()[3] = kNan;  // 3.weight: ReLU(NaN) hides it from the loss
  state.global_step = 2;
  EXPECT_EQ(saver.snapshot(state, *model, *optimizer, {}),
            "model.safetensors: 3.weight: 1 non-finite value(s) (first: nan at index 3)");
  saver.discard();
  saver.write();  // nothing to write
  EXPECT_EQ(saver.last_path(), dir + "/step-1");
  EXPECT_FALSE(std::filesystem::exists(dir + "/step-2"));
  EXPECT_EQ(saver.times().blocked_ms.size(), 1u);
}

// save() is snapshot, agreement and write in one call: a non-finite value is every rank's error.
TEST(Checkpointer, SaveRefusesANonFiniteStateAndWritesNothingOfIt) {
  testing::TempDir tmp;
  const std::string dir = (tmp.path() / "ck").string();
  SelfCommunicator control;
  Checkpointer ckpt(control, {.dir = dir});
  std::unique_ptr<Sequential> model = small_model(0);
  std::unique_ptr<Optimizer> optimizer = make_optimizer(OptimizerSpec{}, model->parameters());
  checkpoint::TrainingState state;
  state.global_step = 1;
  ckpt.save(state, *model, *optimizer);
  model->parameters()[2]->value.data()[3] = kNan;
  state.global_step = 2;
  try {
    ckpt.save(state, *model, *optimizer);
    FAIL() << "a NaN was saved";
  } catch (const AgreedError& e) {
    EXPECT_EQ(std::string(e.what()),
              dir + "/step-2: not saved: model.safetensors: 3.weight: 1 non-finite value(s) (first: nan at index 3)");
  }
  ckpt.finish();
  EXPECT_TRUE(std::filesystem::exists(dir + "/step-1"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/step-2"));
}

TEST(Checkpointer, RestoreLatestGivesBackWhatWasSavedToTheBit) {
  testing::TempDir tmp;
  const std::string dir = (tmp.path() / "ck").string();
  SelfCommunicator control;
  std::unique_ptr<Sequential> model = small_model(1, 0.5f);
  std::unique_ptr<Optimizer> optimizer = make_optimizer(OptimizerSpec{}, model->parameters());
  take_a_step(*model, *optimizer);
  for (uint64_t* c : model->rng_counters()) *c = 1234;
  const nlohmann::json config = {{"lr", 0.1}, {"width", 8}};
  {
    Checkpointer ckpt(control, {.dir = dir});
    checkpoint::TrainingState state;
    state.global_step = 7;
    state.epoch = 1;
    state.sample_in_epoch = 96;
    state.rng = {{"loader", 42}};  // the caller's own state rides along
    state.config = config;
    ckpt.save(state, *model, *optimizer, {{"note", "mine"}});
    ckpt.finish();
  }
  std::unique_ptr<Sequential> other = small_model(2, 0.5f);
  std::unique_ptr<Optimizer> other_optimizer = make_optimizer(OptimizerSpec{}, other->parameters());
  ASSERT_NE(values(*other), values(*model));
  Checkpointer ckpt(control, {.dir = dir});
  const std::optional<Resumed> resumed = restore_newest(control, dir, *other, *other_optimizer, config);
  ASSERT_TRUE(resumed.has_value());
  EXPECT_EQ(resumed->path, dir + "/step-7");
  EXPECT_EQ(resumed->state.global_step, 7);
  EXPECT_EQ(resumed->state.sample_in_epoch, 96);
  EXPECT_EQ(resumed->state.rng["loader"], 42);
  EXPECT_EQ(values(*other), values(*model));
  EXPECT_EQ(values(other_optimizer->export_state()), values(optimizer->export_state()));
  for (uint64_t* c : other->rng_counters()) EXPECT_EQ(*c, 1234u);
  // restore_from names a checkpoint, or a directory that must hold one.
  EXPECT_EQ(restore_from(control, dir + "/step-7", *other, *other_optimizer).path, dir + "/step-7");
}

TEST(Checkpointer, RestoreRefusesAnotherConfigAndFindsNothingInAnEmptyDirectory) {
  testing::TempDir tmp;
  const std::string dir = (tmp.path() / "ck").string();
  SelfCommunicator control;
  std::unique_ptr<Sequential> model = small_model(1);
  std::unique_ptr<Optimizer> optimizer = make_optimizer(OptimizerSpec{}, model->parameters());
  EXPECT_FALSE(restore_newest(control, dir, *model, *optimizer).has_value());
  Checkpointer ckpt(control, {.dir = dir, .background = false});
  checkpoint::TrainingState state;
  state.global_step = 3;
  state.config = {{"lr", 0.1}};
  ckpt.save(state, *model, *optimizer);
  try {
    restore_newest(control, dir, *model, *optimizer, {{"lr", 0.2}});
    FAIL() << "another config was resumed";
  } catch (const AgreedError& e) {
    EXPECT_EQ(std::string(e.what()), dir + "/step-3/state.json: config.lr: checkpoint 0.1, this run 0.2");
  }
  EXPECT_THROW(restore_from(control, (tmp.path() / "none").string(), *model, *optimizer), AgreedError);
}

TEST(Checkpointer, ADirectoryInUseEndsWithTheCallersHint) {
  testing::TempDir tmp;
  const std::string dir = (tmp.path() / "ck").string();
  SelfCommunicator control;
  Checkpointer first(control, {.dir = dir});
  try {
    Checkpointer second(control, {.dir = dir, .in_use_hint = "one job per --checkpoint-dir"});
    FAIL() << "two jobs hold one directory";
  } catch (const AgreedError& e) {
    EXPECT_NE(std::string(e.what()).find(" is in use by another dtrain job ("), std::string::npos) << e.what();
    EXPECT_TRUE(std::string(e.what()).ends_with("; one job per --checkpoint-dir")) << e.what();
  }
}

}  // namespace
}  // namespace dtrain
