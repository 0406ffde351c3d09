// Central finite differences for a Module. The objective is L = sum(y * R) for a fixed random
// R, accumulated in double on the host, so dL/dy = R exactly and backward(R) is checked.
// Tolerance: forward runs in float32. Linear, Conv2d and the piecewise-linear layers (ReLU,
// MaxPool) are exactly linear within +-h as long as no kink lies inside that interval (the
// tests keep inputs away from kinks), so the difference quotient has no truncation error and
// its rounding error is about (float eps 6e-8) * |L| / h; with |L| ~ 10 and h = 1e-2 that is
// ~6e-5. The tests allow 1e-3 absolute + 1e-3 relative.
#pragma once

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/tensor.h"
#include "model/module.h"

namespace dtrain::testing {

inline std::vector<float> random_values(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

inline double dot(const Tensor& y, const std::vector<float>& r) {
  std::vector<float> v = y.to_vector();
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += static_cast<double>(v[i]) * r[i];
  return s;
}

// Checks d(sum(m(x) * R))/d(x) and /d(each parameter) against central differences. With
// check_input false the input is not differentiated (token ids): only the parameters are.
inline void expect_gradients_match(Module& m, Tensor x, float h = 1e-2f, double atol = 1e-3, double rtol = 1e-3,
                                   bool check_input = true) {
  Tensor y = m.forward(x);
  std::vector<float> r = random_values(static_cast<size_t>(y.numel()), 7);
  for (Parameter* p : m.parameters()) p->grad.zero_();
  Tensor dx = m.backward(Tensor::from_vector(r, y.shape()), check_input);
  std::vector<float> analytic_dx;
  if (check_input) {
    ASSERT_TRUE(dx.defined());
    analytic_dx = dx.to_vector();
  }

  auto objective = [&]() { return dot(m.forward(x), r); };
  auto check = [&](Tensor& t, const std::vector<float>& analytic, const std::string& what) {
    std::vector<float> v = t.to_vector();
    for (size_t i = 0; i < v.size(); ++i) {
      float orig = v[i];
      v[i] = orig + h;
      t.copy_from(Tensor::from_vector(v, t.shape()));
      double plus = objective();
      v[i] = orig - h;
      t.copy_from(Tensor::from_vector(v, t.shape()));
      double minus = objective();
      v[i] = orig;
      t.copy_from(Tensor::from_vector(v, t.shape()));
      double numeric = (plus - minus) / (2.0 * h);
      EXPECT_NEAR(analytic[i], numeric, atol + rtol * std::abs(numeric)) << what << "[" << i << "]";
    }
  };
  std::vector<std::vector<float>> analytic_params;
  for (Parameter* p : m.parameters()) analytic_params.push_back(p->grad.to_vector());
  if (check_input) check(x, analytic_dx, "input");
  auto params = m.parameters();
  for (size_t k = 0; k < params.size(); ++k) check(params[k]->value, analytic_params[k], params[k]->name);
}

}  // namespace dtrain::testing
