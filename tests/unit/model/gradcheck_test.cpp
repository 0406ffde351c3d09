// Every layer's backward against central finite differences (tolerances in gradcheck.h).
#include "gradcheck.h"

#include "model/activation.h"
#include "model/conv.h"
#include "model/linear.h"
#include "model/sequential.h"

namespace dtrain {
namespace {

using testing::expect_gradients_match;
using testing::random_values;

// Values in [-1, -0.1] u [0.1, 1]: at least 0.1 from ReLU's kink, far more than h.
Tensor away_from_zero(const Shape& shape, uint32_t seed) {
  std::vector<float> v = random_values(static_cast<size_t>(shape_numel(shape)), seed, 0.1f, 1.f);
  std::vector<float> sign = random_values(v.size(), seed + 1);
  for (size_t i = 0; i < v.size(); ++i) v[i] = sign[i] < 0 ? -v[i] : v[i];
  return Tensor::from_vector(v, shape);
}

TEST(GradCheck, Linear) {
  InitRng rng(1);
  Linear layer(7, 5, Device::cpu(), rng);
  expect_gradients_match(layer, Tensor::from_vector(random_values(3 * 7, 2), {3, 7}));
}

TEST(GradCheck, LinearWithoutBias) {
  InitRng rng(1);
  Linear layer(4, 3, Device::cpu(), rng, false);
  EXPECT_EQ(layer.parameters().size(), 1u);
  expect_gradients_match(layer, Tensor::from_vector(random_values(2 * 4, 3), {2, 4}));
}

TEST(GradCheck, ReLU) {
  ReLU layer;
  expect_gradients_match(layer, away_from_zero({4, 6}, 3));
}

TEST(GradCheck, Conv2dPadded) {
  InitRng rng(2);
  Conv2d layer(2, 3, 3, 1, 1, Device::cpu(), rng);
  expect_gradients_match(layer, Tensor::from_vector(random_values(2 * 2 * 5 * 5, 4), {2, 2, 5, 5}));
}

TEST(GradCheck, Conv2dStrided) {
  InitRng rng(3);
  Conv2d layer(1, 2, 3, 2, 0, Device::cpu(), rng);
  expect_gradients_match(layer, Tensor::from_vector(random_values(2 * 1 * 7 * 6, 5), {2, 1, 7, 6}));
}

TEST(GradCheck, Conv2dStridedPaddedBatch) {  // batch > 1 with stride and padding: the batched column layout
  InitRng rng(5);
  Conv2d layer(2, 3, 3, 2, 1, Device::cpu(), rng);
  expect_gradients_match(layer, Tensor::from_vector(random_values(3 * 2 * 6 * 5, 10), {3, 2, 6, 5}));
}

// Distinct values spaced 0.05 apart (> 2h) so no window's argmax changes under perturbation.
Tensor distinct_values(const Shape& shape, uint32_t seed) {
  const size_t n = static_cast<size_t>(shape_numel(shape));
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.05f * static_cast<float>(i) - 1.f;
  std::mt19937 gen(seed);
  std::shuffle(v.begin(), v.end(), gen);
  return Tensor::from_vector(v, shape);
}

TEST(GradCheck, MaxPoolNonOverlapping) {
  MaxPool2d layer(2);
  expect_gradients_match(layer, distinct_values({2, 2, 4, 6}, 6), 1e-2f);
}

TEST(GradCheck, MaxPoolOverlappingPadded) {
  MaxPool2d layer(3, 2, 1);
  expect_gradients_match(layer, distinct_values({1, 2, 5, 5}, 7), 1e-2f);
}

TEST(GradCheck, FlattenIsAReshape) {
  Flatten layer;
  expect_gradients_match(layer, Tensor::from_vector(random_values(2 * 3 * 2, 8), {2, 3, 2}));
}

TEST(GradCheck, SmallConvNet) {
  InitRng rng(4);
  Sequential net;
  net.emplace<Conv2d>(1, 2, 3, 1, 1, Device::cpu(), rng);
  net.emplace<MaxPool2d>(2);
  net.emplace<Flatten>();
  net.emplace<Linear>(2 * 3 * 3, 4, Device::cpu(), rng);
  // Smooth except at ties/kinks; with h = 1e-3 the chance of crossing one is negligible and the
  // seeded input is fixed, so this is deterministic.
  expect_gradients_match(net, Tensor::from_vector(random_values(2 * 1 * 6 * 6, 9), {2, 1, 6, 6}), 1e-3f, 2e-3, 2e-3);
}

TEST(Dropout, TrainingMasksAndScalesEvalIsIdentity) {
  Dropout layer(0.5f, 42);
  std::vector<float> ones(1000, 1.f);
  Tensor x = Tensor::from_vector(ones, {10, 100});
  std::vector<float> y = layer.forward(x).to_vector();
  int zeros = 0;
  for (float v : y) {
    EXPECT_TRUE(v == 0.f || v == 2.f) << v;
    zeros += v == 0.f;
  }
  EXPECT_GT(zeros, 400);
  EXPECT_LT(zeros, 600);
  // Backward passes the gradient exactly where the forward kept the value, scaled alike.
  std::vector<float> g = layer.backward(Tensor::from_vector(ones, {10, 100})).to_vector();
  EXPECT_EQ(g, y);
  layer.set_training(false);
  EXPECT_EQ(layer.forward(x).to_vector(), ones);
}

// A checkpoint saves the counters rng_counters() exposes; a model built afresh and given them
// draws the masks the original draws next (what a bitwise resume with dropout needs).
TEST(Dropout, RestoredRngCountersDrawTheSameMasks) {
  auto make = [] {
    auto net = std::make_unique<Sequential>();
    net->emplace<Dropout>(0.5f, 7);
    net->emplace<ReLU>();
    net->emplace<Dropout>(0.3f, 8);
    return net;
  };
  auto original_net = make();
  Sequential& original = *original_net;
  Tensor x = Tensor::from_vector(std::vector<float>(64, 1.f), {4, 16});
  original.forward(x);
  original.forward(x);
  std::vector<uint64_t> saved;
  for (uint64_t* c : original.rng_counters()) saved.push_back(*c);
  ASSERT_EQ(saved.size(), 2u);
  EXPECT_EQ(saved[0], 128u);  // two forwards of 64 draws each

  auto resumed = make();
  std::vector<uint64_t*> counters = resumed->rng_counters();
  for (size_t i = 0; i < counters.size(); ++i) *counters[i] = saved[i];
  EXPECT_EQ(resumed->forward(x).to_vector(), original.forward(x).to_vector());
  auto fresh = make();
  EXPECT_NE(fresh->forward(x).to_vector(), original.forward(x).to_vector()) << "the counter must matter";
}

}  // namespace
}  // namespace dtrain
