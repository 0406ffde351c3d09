// Note [Fused ReLU]: a ReLU after Linear or Conv2d in a Sequential is applied by that layer.
// The fused pair gives the unfused pair's output and input gradient bitwise and its parameter
// gradients within float rounding (only the bias gradient sums in another order), keeps
// PyTorch's parameter names, passes the finite-difference check, and a smaller batch after a
// larger one gives what a fresh model gives.
#include <gtest/gtest.h>

#include "gradcheck.h"
#include "model/activation.h"
#include "model/conv.h"
#include "model/linear.h"
#include "model/sequential.h"

namespace dtrain {
namespace {

using testing::expect_gradients_match;
using testing::random_values;

struct Outputs {
  std::vector<float> y, dx;
  std::vector<std::vector<float>> grads;
};

// forward and backward through `layers` in order (by hand: no Sequential, so nothing fuses).
Outputs run_unfused(std::vector<Module*> layers, const Tensor& x, const std::vector<float>& r) {
  Tensor y = x;
  for (Module* m : layers) y = m->forward(y);
  Tensor g = Tensor::from_vector(r, y.shape());
  for (size_t i = layers.size(); i-- > 0;) g = layers[i]->backward(g);
  Outputs o{y.to_vector(), g.to_vector(), {}};
  for (Module* m : layers)
    for (Parameter* p : m->parameters()) o.grads.push_back(p->grad.to_vector());
  return o;
}

Outputs run_fused(Sequential& net, const Tensor& x, const std::vector<float>& r) {
  Tensor y = net.forward(x);
  Tensor dx = net.backward(Tensor::from_vector(r, y.shape()));
  Outputs o{y.to_vector(), dx.to_vector(), {}};
  for (Parameter* p : net.parameters()) o.grads.push_back(p->grad.to_vector());
  return o;
}

void expect_same_up_to_bias_rounding(const Outputs& fused, const Outputs& unfused) {
  EXPECT_EQ(fused.y, unfused.y) << "output";
  EXPECT_EQ(fused.dx, unfused.dx) << "input gradient";
  ASSERT_EQ(fused.grads.size(), unfused.grads.size());
  for (size_t k = 0; k < fused.grads.size(); ++k)
    for (size_t i = 0; i < fused.grads[k].size(); ++i)
      EXPECT_NEAR(fused.grads[k][i], unfused.grads[k][i], 1e-5f * (1.f + std::abs(unfused.grads[k][i])))
          << "parameter " << k << "[" << i << "]";
}

TEST(FusedRelu, LinearThenReluEqualsTheUnfusedPair) {
  const Tensor x = Tensor::from_vector(random_values(5 * 9, 1), {5, 9});
  const std::vector<float> r = random_values(5 * 6, 2);
  InitRng rng_a(3), rng_b(3);
  Linear alone(9, 6, Device::cpu(), rng_a);
  ReLU relu;
  Sequential net;
  net.emplace<Linear>(9, 6, Device::cpu(), rng_b).emplace<ReLU>();
  for (Parameter* p : net.parameters()) p->grad_is_zero = true;
  for (Parameter* p : alone.parameters()) p->grad_is_zero = true;
  expect_same_up_to_bias_rounding(run_fused(net, x, r), run_unfused({&alone, &relu}, x, r));
}

TEST(FusedRelu, Conv2dThenReluEqualsTheUnfusedPair) {
  const Tensor x = Tensor::from_vector(random_values(3 * 2 * 7 * 6, 4), {3, 2, 7, 6});
  InitRng rng_a(5), rng_b(5);
  Conv2d alone(2, 4, 3, 2, 1, Device::cpu(), rng_a);
  ReLU relu;
  Sequential net;
  net.emplace<Conv2d>(2, 4, 3, 2, 1, Device::cpu(), rng_b).emplace<ReLU>();
  const std::vector<float> r = random_values(3 * 4 * 4 * 3, 6);
  for (Parameter* p : net.parameters()) p->grad_is_zero = true;
  for (Parameter* p : alone.parameters()) p->grad_is_zero = true;
  expect_same_up_to_bias_rounding(run_fused(net, x, r), run_unfused({&alone, &relu}, x, r));
}

TEST(FusedRelu, NamesAndDescriptionStayPyTorchs) {
  InitRng rng(7);
  Sequential net;
  net.emplace<Flatten>().emplace<Linear>(4, 3, Device::cpu(), rng).emplace<ReLU>().emplace<Linear>(3, 2, Device::cpu(), rng);
  std::vector<std::string> names;
  for (Parameter* p : net.parameters()) names.push_back(p->name);
  EXPECT_EQ(names, (std::vector<std::string>{"1.weight", "1.bias", "3.weight", "3.bias"}));
  EXPECT_EQ(net.describe(), "Sequential(Flatten(), Linear(4, 3), ReLU(), Linear(3, 2))");
  EXPECT_EQ(net.size(), 4u);
}

// Values away from the kinks (as gradcheck_test.cpp's ReLU check) so +-h crosses none.
TEST(FusedRelu, GradientsOfFusedNetsMatchFiniteDifferences) {
  InitRng rng(8);
  Sequential mlp;
  mlp.emplace<Linear>(6, 5, Device::cpu(), rng).emplace<ReLU>().emplace<Linear>(5, 3, Device::cpu(), rng);
  expect_gradients_match(mlp, Tensor::from_vector(random_values(4 * 6, 9), {4, 6}), 1e-3f, 2e-3, 2e-3);
  Sequential cnn;
  cnn.emplace<Conv2d>(1, 2, 3, 1, 1, Device::cpu(), rng).emplace<ReLU>().emplace<MaxPool2d>(2).emplace<Flatten>();
  cnn.emplace<Linear>(2 * 3 * 3, 4, Device::cpu(), rng).emplace<ReLU>();
  expect_gradients_match(cnn, Tensor::from_vector(random_values(2 * 1 * 6 * 6, 10), {2, 1, 6, 6}), 1e-3f, 2e-3, 2e-3);
}

// A net that has run a larger batch (larger buffers, masks) gives a smaller batch exactly what a
// fresh net gives.
TEST(FusedRelu, SmallerBatchAfterLargerMatchesFreshNet) {
  auto make = [] {
    InitRng rng(11);
    auto net = std::make_unique<Sequential>();
    net->emplace<Conv2d>(1, 3, 3, 1, 1, Device::cpu(), rng).emplace<ReLU>().emplace<MaxPool2d>(2).emplace<Flatten>();
    net->emplace<Linear>(3 * 4 * 4, 5, Device::cpu(), rng).emplace<ReLU>().emplace<Linear>(5, 3, Device::cpu(), rng);
    return net;
  };
  auto run = [](Sequential& net, int64_t batch, uint32_t seed) {
    Tensor x = Tensor::from_vector(random_values(static_cast<size_t>(batch * 64), seed), {batch, 1, 8, 8});
    for (Parameter* p : net.parameters()) p->grad_is_zero = true;
    Tensor y = net.forward(x);
    Tensor dx = net.backward(Tensor::from_vector(random_values(static_cast<size_t>(y.numel()), seed + 1), y.shape()));
    std::vector<std::vector<float>> out{y.to_vector(), dx.to_vector()};
    for (Parameter* p : net.parameters()) out.push_back(p->grad.to_vector());
    return out;
  };
  auto used = make(), fresh = make();
  run(*used, 6, 20);
  EXPECT_EQ(run(*used, 2, 30), run(*fresh, 2, 30));
}

}  // namespace
}  // namespace dtrain
