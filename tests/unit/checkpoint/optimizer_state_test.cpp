// Optimizer state through a checkpoint: export under PyTorch's names, write with the parameters
// to safetensors, read into a fresh model and optimizer, and the continued run is bitwise the
// uninterrupted one (SGD with momentum and dampening, Nesterov, AdamW). Import rejects state that
// does not fit with one line naming the entry.
#include <cstring>

#include <gtest/gtest.h>

#include "../data/temp_dir.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "model/loss.h"
#include "model/models.h"
#include "model/optimizer.h"

namespace dtrain {
namespace {

using dtrain::testing::TempDir;

// What the trainer will do: the optimizer's state as safetensors entries and back.
std::vector<safetensors::HostTensor> optimizer_entries(const OptimizerState& state) {
  std::vector<safetensors::HostTensor> out;
  for (const auto& e : state.tensors) out.push_back(safetensors::host_copy(e.name, e.value));
  for (const auto& c : state.counts) out.push_back(safetensors::i64_scalar(c.name, c.value));
  return out;
}

OptimizerState optimizer_state_from(const safetensors::File& file) {
  OptimizerState state;
  for (const safetensors::TensorInfo& info : file.header().tensors) {
    if (info.dtype == safetensors::Dtype::kI64)
      state.counts.push_back({info.name, file.i64_scalar(info.name)});
    else
      state.tensors.push_back({info.name, file.to_tensor(info.name)});
  }
  return state;
}

enum class Kind { kSgdMomentumDampening, kSgdNesterov, kAdamW };

struct TrainingRun {
  std::unique_ptr<Sequential> model;
  std::unique_ptr<Optimizer> optimizer;
  CrossEntropyLoss loss;

  TrainingRun(Kind kind, uint64_t seed) : model(build_model(ModelSpec{ModelKind::kMlp, {12, 8}}, {1, 4, 4}, 3, Device::cpu(), seed)) {
    auto params = model->parameters();
    if (kind == Kind::kAdamW) optimizer = std::make_unique<AdamW>(params, AdamWOptions{0.01f, 0.9f, 0.999f, 1e-8f, 0.1f});
    if (kind == Kind::kSgdNesterov) optimizer = std::make_unique<Sgd>(params, SgdOptions{0.05f, 0.9f, 0.f, 0.01f, true});
    if (kind == Kind::kSgdMomentumDampening)
      optimizer = std::make_unique<Sgd>(params, SgdOptions{0.05f, 0.9f, 0.25f, 0.01f, false});
  }

  // One optimizer step on batch `step`. The last bias gets no gradient before step 5 (an unused
  // parameter): its state starts later, as PyTorch's would.
  void train_step(int step) {
    std::vector<float> pixels(6 * 16);
    for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<float>((i * 7 + step * 13) % 29) / 29.f - 0.4f;
    Tensor labels = Tensor::empty({6}, Device::cpu(), DType::kI32);
    for (int i = 0; i < 6; ++i) labels.data_as<int32_t>()[i] = (i + step) % 3;
    optimizer->zero_grad();
    loss.forward(model->forward(Tensor::from_vector(pixels, {6, 1, 4, 4})), labels);
    model->backward(loss.backward(), false);
    if (step < 5) model->parameters().back()->grad_is_zero = true;
    optimizer->step();
  }

  std::vector<safetensors::HostTensor> parameters() {
    std::vector<safetensors::HostTensor> out;
    for (Parameter* p : model->parameters()) out.push_back(safetensors::host_copy(p->name, p->value));
    return out;
  }
};

TEST(OptimizerState, ResumeThroughSafetensorsIsBitwiseIdentical) {
  for (Kind kind : {Kind::kSgdMomentumDampening, Kind::kSgdNesterov, Kind::kAdamW}) {
    SCOPED_TRACE(static_cast<int>(kind));
    constexpr int kStop = 3, kTotal = 9;  // the checkpoint comes before the last bias is first updated
    TrainingRun whole(kind, 7);
    for (int s = 0; s < kTotal; ++s) whole.train_step(s);

    TempDir dir;
    {
      TrainingRun first(kind, 7);
      for (int s = 0; s < kStop; ++s) first.train_step(s);
      safetensors::write_file(dir.file("model.safetensors"), safetensors::refs(first.parameters()));
      safetensors::write_file(dir.file("optimizer.safetensors"),
                              safetensors::refs(optimizer_entries(first.optimizer->export_state())));
    }
    TrainingRun resumed(kind, 99);  // other initial weights: everything must come from the files
    std::vector<safetensors::NamedTarget> targets;
    for (Parameter* p : resumed.model->parameters()) targets.push_back({p->name, &p->value});
    safetensors::load_named(safetensors::read_file(dir.file("model.safetensors")), targets);
    resumed.optimizer->import_state(optimizer_state_from(safetensors::read_file(dir.file("optimizer.safetensors"))));
    for (int s = kStop; s < kTotal; ++s) resumed.train_step(s);

    auto a = whole.model->parameters(), b = resumed.model->parameters();
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_EQ(std::memcmp(a[i]->value.raw(), b[i]->value.raw(), a[i]->value.nbytes()), 0) << a[i]->name;
  }
}

TEST(OptimizerState, UsesPyTorchStateDictNames) {
  TrainingRun sgd(Kind::kSgdNesterov, 1), adamw(Kind::kAdamW, 1);
  sgd.train_step(0);
  adamw.train_step(0);
  std::vector<std::string> names;
  for (const auto& e : sgd.optimizer->export_state().tensors) names.push_back(e.name);
  EXPECT_EQ(names, (std::vector<std::string>{"1.weight.momentum_buffer", "1.bias.momentum_buffer",
                                             "3.weight.momentum_buffer", "3.bias.momentum_buffer",
                                             "5.weight.momentum_buffer"}));  // 5.bias: no update yet
  OptimizerState a = adamw.optimizer->export_state();
  EXPECT_EQ(a.tensors[0].name, "1.weight.exp_avg");
  EXPECT_EQ(a.tensors[1].name, "1.weight.exp_avg_sq");
  ASSERT_EQ(a.counts.size(), 5u);
  EXPECT_EQ(a.counts[0].name, "1.weight.step");
  EXPECT_EQ(a.counts[0].value, 1);
}

std::string import_error(Optimizer& optimizer, const OptimizerState& state) {
  try {
    optimizer.import_state(state);
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(OptimizerState, ImportNamesTheFirstMismatch) {
  TrainingRun sgd(Kind::kSgdNesterov, 1), adamw(Kind::kAdamW, 1);
  const Shape w1 = sgd.model->parameters()[0]->value.shape();
  EXPECT_EQ(import_error(*sgd.optimizer, {{{"9.weight.momentum_buffer", Tensor::zeros(w1)}}, {}}),
            "optimizer state: '9.weight.momentum_buffer' names no parameter of this model");
  EXPECT_EQ(import_error(*sgd.optimizer, {{{"1.weight.exp_avg", Tensor::zeros(w1)}}, {}}),
            "optimizer state: '1.weight.exp_avg' is not state this sgd optimizer keeps (it keeps momentum_buffer)");
  EXPECT_EQ(import_error(*sgd.optimizer, {{{"1.weight.momentum_buffer", Tensor::zeros({3, 4})}}, {}}),
            "optimizer state: '1.weight.momentum_buffer' is float32 [3, 4], the parameter needs float32 [12, 16]");
  EXPECT_EQ(import_error(*sgd.optimizer,
                         {{{"1.weight.momentum_buffer", Tensor::zeros(w1)}, {"1.weight.momentum_buffer", Tensor::zeros(w1)}}, {}}),
            "optimizer state: '1.weight.momentum_buffer' appears twice");
  EXPECT_EQ(import_error(*sgd.optimizer, {{}, {{"1.weight.step", 3}}}),
            "optimizer state: '1.weight.step' is not state this sgd optimizer keeps");
  EXPECT_EQ(import_error(*adamw.optimizer, {{{"1.weight.exp_avg", Tensor::zeros(w1)}}, {{"1.weight.step", 3}}}),
            "optimizer state: '1.weight.exp_avg_sq' is missing (the parameter has other AdamW state)");
  EXPECT_EQ(import_error(*adamw.optimizer, {{{"1.weight.exp_avg", Tensor::zeros(w1)}, {"1.weight.exp_avg_sq", Tensor::zeros(w1)}},
                                            {{"1.weight.step", 0}}}),
            "optimizer state: '1.weight.step' is 0, expected a step count >= 1");
}

}  // namespace
}  // namespace dtrain
