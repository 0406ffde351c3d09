// The gradient-ready hook: once per parameter per backward, in reverse layer order, and only
// when that parameter's gradient is final (equal to what it holds after backward returns).
#include <cmath>

#include <gtest/gtest.h>

#include "core/error.h"
#include "model/loss.h"
#include "model/models.h"

namespace dtrain {
namespace {

TEST(GradReadyHook, FiresOncePerParameterInReverseOrderWithFinalGradient) {
  for (const char* name : {"mlp", "cnn"}) {
    ModelSpec spec{name, {32, 16}, 0.f};
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
    ASSERT_EQ(order.size(), params.size()) << name;
    for (size_t i = 0; i < params.size(); ++i) {
      const Parameter& p = *params[params.size() - 1 - i];  // reverse of forward order
      EXPECT_EQ(order[i], p.name) << name;
      EXPECT_EQ(at_hook[i], p.grad.to_vector()) << name << " " << p.name << " changed after its hook";
    }
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

TEST(Models, UnknownModelAndBadWidthAreUsageErrors) {
  EXPECT_THROW(build_model(ModelSpec{"resnet"}, {1, 28, 28}, 10, Device::cpu(), 0), UsageError);
  EXPECT_THROW(build_model(ModelSpec{"mlp", {0}}, {1, 28, 28}, 10, Device::cpu(), 0), UsageError);
}

}  // namespace
}  // namespace dtrain
