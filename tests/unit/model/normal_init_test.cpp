// InitRng::normal and normal_init (model/init.h), GPT-2's initialisation: the draws have the
// asked mean and standard deviation, the tails of a normal, and the same seed gives the same bits.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "model/init.h"

namespace dtrain {
namespace {

TEST(NormalInit, MeanStdAndTailsOfANormalAndSeeded) {
  InitRng rng(11);
  const int n = 200000;
  double s = 0, s2 = 0;
  int beyond_2sd = 0;
  for (int i = 0; i < n; ++i) {
    const double v = rng.normal(1.5f, 0.25f);
    s += v;
    s2 += v * v;
    beyond_2sd += std::abs(v - 1.5) > 0.5;
  }
  const double mean = s / n, sd = std::sqrt(s2 / n - mean * mean);
  EXPECT_NEAR(mean, 1.5, 0.003);            // standard error 0.25 / sqrt(2e5) = 5.6e-4
  EXPECT_NEAR(sd, 0.25, 0.0025);            // 1%; its standard error is 0.16%
  EXPECT_NEAR(beyond_2sd / double(n), 0.0455, 0.003);  // P(|z| > 2) of a normal

  Tensor a = Tensor::empty({64, 32}), b = Tensor::empty({64, 32});
  InitRng r1(5), r2(5);
  normal_init(a, 0.02f, r1);
  normal_init(b, 0.02f, r2);
  EXPECT_EQ(a.to_vector(), b.to_vector());
  for (float v : a.to_vector()) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace dtrain
