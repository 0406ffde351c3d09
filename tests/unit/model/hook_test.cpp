// The gradient-ready hook: once per parameter per backward, in reverse layer order, and only
// when that parameter's gradient is final (equal to what it holds after backward returns).
#include <cmath>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/ops.h"
#include "model/linear.h"
#include "model/loss.h"
#include "model/optimizer.h"
#include "model/models.h"

namespace dtrain {
namespace {

TEST(GradReadyHook, FiresOncePerParameterInReverseOrderWithFinalGradient) {
  for (ModelKind kind : {ModelKind::kMlp, ModelKind::kCnn}) {
    ModelSpec spec{kind, {32, 16}, 0.f};
    auto model = build_model(spec, {1, 28, 28}, 10, Device::cpu(), 3);
    std::vector<std::string> order;
    std::vector<std::vector<float>> at_hook;
    model->set_grad_ready_hook([&](Parameter& p) {
      order.push_back(p.name);
      at_hook.push_back(p.grad.to_vector());
    });
    std::vector<float> pixels(4 * 784);
    for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<float>(i % 97) / 97.f;
    Tensor labels = Tensor::empty({4}, Device::cpu(), DType::kI32);
    for (int i = 0; i < 4; ++i) labels.data_as<int32_t>()[i] = i;
    CrossEntropyLoss loss;
    loss.forward(model->forward(Tensor::from_vector(pixels, {4, 1, 28, 28})), labels);
    model->backward(loss.backward(), false);

    auto params = model->parameters();
    ASSERT_EQ(order.size(), params.size()) << model_kind_name(kind);
    for (size_t i = 0; i < params.size(); ++i) {
      const Parameter& p = *params[params.size() - 1 - i];  // reverse of forward order
      EXPECT_EQ(order[i], p.name) << model_kind_name(kind);
      EXPECT_EQ(at_hook[i], p.grad.to_vector()) << model_kind_name(kind) << " " << p.name << " changed after its hook";
    }
  }
}

TEST(ZeroGrad, BackwardAfterZeroGradOverwritesStaleMemoryThenAccumulates) {
  for (ModelKind kind : {ModelKind::kMlp, ModelKind::kCnn}) {
    auto model = build_model(ModelSpec{kind, {16}}, {1, 28, 28}, 10, Device::cpu(), 3);
    std::vector<float> pixels(2 * 784);
    for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<float>(i % 13) / 13.f;
    Tensor x = Tensor::from_vector(pixels, {2, 1, 28, 28});
    Tensor labels = Tensor::zeros({2}, Device::cpu(), DType::kI32);
    CrossEntropyLoss loss;
    auto grads = [&] {
      std::vector<std::vector<float>> g;
      for (Parameter* p : model->parameters()) g.push_back(p->grad.to_vector());
      return g;
    };
    auto backward_once = [&] {
      loss.forward(model->forward(x), labels);
      model->backward(loss.backward(), false);
    };
    backward_once();  // onto the zeros of construction
    auto once = grads();
    Sgd opt(model->parameters(), SgdOptions{});
    for (Parameter* p : model->parameters()) fill(p->grad, std::nanf(""));  // stale garbage
    opt.zero_grad();
    backward_once();
    EXPECT_EQ(grads(), once) << model_kind_name(kind) << ": the first backward after zero_grad must overwrite";
    backward_once();
    auto twice = grads();
    for (size_t i = 0; i < once.size(); ++i)
      for (size_t j = 0; j < once[i].size(); ++j)  // same sums, another order: rounding only
        ASSERT_NEAR(twice[i][j], 2 * once[i][j], 1e-5 * (1e-3 + std::abs(2 * once[i][j]))) << model_kind_name(kind);
  }
}

TEST(GradReadyHook, ParameterNamesFollowPyTorchSequential) {
  auto model = build_model(ModelSpec{}, {1, 28, 28}, 10, Device::cpu(), 0);
  std::vector<std::string> names;
  for (Parameter* p : model->parameters()) names.push_back(p->name);
  EXPECT_EQ(names, (std::vector<std::string>{"1.weight", "1.bias", "3.weight", "3.bias"}));
  EXPECT_EQ(model->describe(), "Sequential(Flatten(), Linear(784, 256), ReLU(), Linear(256, 10))");
}

TEST(Init, SeededKaimingUniformWithinBoundsAndReproducible) {
  auto a = build_model(ModelSpec{}, {1, 28, 28}, 10, Device::cpu(), 5);
  auto b = build_model(ModelSpec{}, {1, 28, 28}, 10, Device::cpu(), 5);
  auto c = build_model(ModelSpec{}, {1, 28, 28}, 10, Device::cpu(), 6);
  auto pa = a->parameters(), pb = b->parameters(), pc = c->parameters();
  EXPECT_EQ(pa[0]->value.to_vector(), pb[0]->value.to_vector());
  EXPECT_NE(pa[0]->value.to_vector(), pc[0]->value.to_vector());
  const float bound = 1.f / std::sqrt(784.f);
  float lo = 1, hi = -1;
  for (float v : pa[0]->value.to_vector()) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_GE(lo, -bound);
  EXPECT_LT(hi, bound);
  EXPECT_LT(lo, -0.95f * bound);  // 200k draws fill the interval
  EXPECT_GT(hi, 0.95f * bound);
}

TEST(Models, KindsParseTheirNamesAndANonPositiveWidthIsRefused) {
  EXPECT_EQ(parse_model_kind("mlp"), ModelKind::kMlp);
  EXPECT_EQ(parse_model_kind("cnn"), ModelKind::kCnn);
  EXPECT_FALSE(parse_model_kind("resnet").has_value());
  EXPECT_STREQ(model_kind_name(ModelKind::kCnn), "cnn");
  EXPECT_THROW(build_model(ModelSpec{ModelKind::kMlp, {0}}, {1, 28, 28}, 10, Device::cpu(), 0), Error);
}

}  // namespace
}  // namespace dtrain

namespace dtrain {
namespace {

// Counts how often the wrapped layer is asked for an input gradient.
class Probe : public Module {
 public:
  explicit Probe(int* calls) : calls_(calls) {}
  Tensor forward(const Tensor& x) override { return x; }
  Tensor backward(const Tensor& g, bool need_input_grad) override {
    if (need_input_grad) ++*calls_;
    return need_input_grad ? g : Tensor{};
  }
  std::string describe() const override { return "Probe()"; }

 private:
  int* calls_;
};

TEST(Sequential, NoInputGradientBelowTheFirstParameterisedLayer) {
  int below = 0, above = 0;
  InitRng rng(1);
  Sequential net;
  net.emplace<Probe>(&below);  // like Flatten before the MLP's first Linear
  net.emplace<Linear>(4, 3, Device::cpu(), rng);
  net.emplace<Probe>(&above);
  net.emplace<Linear>(3, 2, Device::cpu(), rng);
  Tensor x = Tensor::from_vector(std::vector<float>(8, 0.5f), {2, 4});
  net.forward(x);
  Tensor g = Tensor::from_vector(std::vector<float>(4, 1.f), {2, 2});
  EXPECT_FALSE(net.backward(g, false).defined());
  EXPECT_EQ(below, 0) << "the layer below the first Linear was asked for a gradient nobody reads";
  EXPECT_EQ(above, 1);
  EXPECT_TRUE(net.backward(g, true).defined());
  EXPECT_EQ(below, 1);
}

}  // namespace
}  // namespace dtrain
