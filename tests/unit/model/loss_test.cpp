// CrossEntropyLoss: value against a double-precision reference, gradient against finite
// differences, weights and reductions as PyTorch defines them, stability for large logits.
#include <cmath>

#include <gtest/gtest.h>

#include "model/loss.h"

namespace dtrain {
namespace {

double reference_loss(const std::vector<float>& z, const std::vector<int32_t>& y, int64_t classes,
                      const std::vector<float>& w, bool mean) {
  double total = 0, weight_sum = 0;
  for (size_t r = 0; r < y.size(); ++r) {
    double m = -1e300, s = 0;
    for (int64_t c = 0; c < classes; ++c) m = std::max(m, static_cast<double>(z[r * classes + c]));
    for (int64_t c = 0; c < classes; ++c) s += std::exp(z[r * classes + c] - m);
    double wr = w.empty() ? 1.0 : w[y[r]];
    total += wr * (std::log(s) + m - z[r * classes + y[r]]);
    weight_sum += wr;
  }
  return mean ? total / weight_sum : total;
}

Tensor labels_tensor(const std::vector<int32_t>& y) {
  Tensor t = Tensor::empty({static_cast<int64_t>(y.size())}, Device::cpu(), DType::kI32);
  std::copy(y.begin(), y.end(), t.data_as<int32_t>());
  return t;
}

struct Case {
  Reduction reduction;
  std::vector<float> weights;
};

class CrossEntropy : public ::testing::TestWithParam<Case> {};

TEST_P(CrossEntropy, ValueAndGradientMatchReference) {
  const Case& c = GetParam();
  const int64_t rows = 5, classes = 4;
  std::vector<float> z = {0.1f, -0.3f, 2.0f, 0.5f, 1.0f, 1.0f, 1.0f, 1.0f, -2.f, 3.f, 0.f, 0.5f,
                          0.7f, 0.2f, -0.4f, 1.5f, 0.3f, 0.3f, -1.f, 0.f};
  std::vector<int32_t> y = {2, 0, 1, 3, 1};
  const bool mean = c.reduction == Reduction::kMean;
  CrossEntropyLoss loss(c.reduction, c.weights);
  Tensor labels = labels_tensor(y);
  float value = loss_value(loss.forward(Tensor::from_vector(z, {rows, classes}), labels));
  EXPECT_NEAR(value, reference_loss(z, y, classes, c.weights, mean), 1e-5);
  std::vector<float> grad = loss.backward().to_vector();
  const double h = 1e-3;  // smooth function: truncation ~h^2, rounding ~1e-7/h; allow 2e-4
  for (size_t i = 0; i < z.size(); ++i) {
    std::vector<float> zp = z, zm = z;
    zp[i] += static_cast<float>(h);
    zm[i] -= static_cast<float>(h);
    double numeric = (reference_loss(zp, y, classes, c.weights, mean) - reference_loss(zm, y, classes, c.weights, mean)) /
                     (2 * h);
    EXPECT_NEAR(grad[i], numeric, 2e-4) << "logit " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Reductions, CrossEntropy,
                         ::testing::Values(Case{Reduction::kMean, {}}, Case{Reduction::kSum, {}},
                                           Case{Reduction::kMean, {0.5f, 2.f, 1.f, 0.25f}},
                                           Case{Reduction::kSum, {0.5f, 2.f, 1.f, 0.25f}}));

TEST(CrossEntropyStability, HugeLogitsStayFinite) {
  CrossEntropyLoss loss;
  std::vector<float> z = {1000.f, -1000.f, 999.f, 88.f, 90.f, 89.f};
  float value = loss_value(loss.forward(Tensor::from_vector(z, {2, 3}), labels_tensor({2, 0})));
  EXPECT_TRUE(std::isfinite(value));
  EXPECT_NEAR(value, reference_loss(z, {2, 0}, 3, {}, true), 1e-4);
  for (float g : loss.backward().to_vector()) EXPECT_TRUE(std::isfinite(g));
}

TEST(Accuracy, CountsArgmaxHits) {
  std::vector<float> z = {0.f, 1.f, 0.f, 5.f, 1.f, 2.f, 0.f, 0.f, 3.f};
  EXPECT_EQ(count_correct(Tensor::from_vector(z, {3, 3}), labels_tensor({1, 1, 2})), 2);
}

}  // namespace
}  // namespace dtrain
