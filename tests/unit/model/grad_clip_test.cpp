// Clipping by the global gradient norm against a naive computation of
// torch.nn.utils.clip_grad_norm_ (norm over all gradients, coefficient min(1, max / (norm + 1e-6))).
#include <cmath>
#include <memory>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "model/flat_store.h"
#include "model/grad_clip.h"

namespace dtrain {
namespace {

struct Params {
  std::vector<std::unique_ptr<Parameter>> owned;
  std::vector<Parameter*> ptrs;
  // Gradients of several sizes (one spans several chunks), values i-dependent.
  Params() {
    int k = 0;
    for (int64_t n : {3, 1024, 5000, 1}) {
      std::vector<float> g(static_cast<size_t>(n));
      for (auto& v : g) v = 0.01f * static_cast<float>((k++ * 37) % 101 - 50);
      owned.push_back(std::make_unique<Parameter>(
          Parameter{fmt::format("p{}", owned.size()), Tensor::zeros({n}), Tensor::from_vector(g, {n})}));
      ptrs.push_back(owned.back().get());
    }
  }
  double naive_norm(bool skip_absent = true) const {
    double s = 0;
    for (const Parameter* p : ptrs) {
      if (skip_absent && p->grad_is_zero) continue;
      for (float v : p->grad.to_vector()) s += static_cast<double>(v) * v;
    }
    return std::sqrt(s);
  }
};

TEST(GradNormClipper, NormMatchesNaiveSumAndLargeNormsAreScaledToMax) {
  Params ps;
  const double norm = ps.naive_norm();
  ASSERT_GT(norm, 1.0);
  std::vector<std::vector<float>> before;
  for (const Parameter* p : ps.ptrs) before.push_back(p->grad.to_vector());
  GradNormClipper clipper(ps.ptrs);
  clipper.clip(1.0f);
  EXPECT_NEAR(clipper.last_norm(), norm, 1e-5 * norm);
  const float coef = 1.0f / (static_cast<float>(norm) + 1e-6f);
  EXPECT_NEAR(clipper.result().to_vector()[1], coef, 1e-6 * coef);
  for (size_t i = 0; i < ps.ptrs.size(); ++i) {
    const std::vector<float> after = ps.ptrs[i]->grad.to_vector();
    for (size_t j = 0; j < after.size(); ++j) EXPECT_NEAR(after[j], before[i][j] * coef, 1e-7) << i << "," << j;
  }
  EXPECT_NEAR(ps.naive_norm(), 1.0, 1e-5) << "after clipping the global norm is max_norm";
}

// 2500 one-element gradients: 2500 chunk sums, three groups of the second stage (the last one
// partial); every group must reach the total.
TEST(GradNormClipper, TotalOverSeveralGroupsOfChunkSumsCountsEveryChunk) {
  std::vector<std::unique_ptr<Parameter>> owned;
  std::vector<Parameter*> ptrs;
  double naive = 0;
  for (int i = 0; i < 2500; ++i) {
    const float v = 0.001f * static_cast<float>(i % 97 + 1);
    naive += static_cast<double>(v) * v;
    owned.push_back(std::make_unique<Parameter>(
        Parameter{fmt::format("q{}", i), Tensor::zeros({1}), Tensor::from_vector(std::vector<float>{v}, {1})}));
    ptrs.push_back(owned.back().get());
  }
  GradNormClipper clipper(ptrs);
  clipper.clip(0.f);
  EXPECT_NEAR(clipper.last_norm(), std::sqrt(naive), 1e-6 * std::sqrt(naive));
}

TEST(GradNormClipper, SmallNormsAndMaxZeroLeaveGradientsBitwiseAlone) {
  for (float max_norm : {1e6f, 0.f}) {
    Params ps;
    std::vector<std::vector<float>> before;
    for (const Parameter* p : ps.ptrs) before.push_back(p->grad.to_vector());
    GradNormClipper clipper(ps.ptrs);
    clipper.clip(max_norm);
    EXPECT_NEAR(clipper.last_norm(), ps.naive_norm(), 1e-5 * ps.naive_norm()) << "the norm is measured either way";
    EXPECT_EQ(clipper.result().to_vector()[1], 1.f);
    for (size_t i = 0; i < ps.ptrs.size(); ++i) EXPECT_EQ(ps.ptrs[i]->grad.to_vector(), before[i]) << max_norm;
  }
}

TEST(GradNormClipper, AbsentGradientsCountAsNoneAndStayUntouched) {
  Params ps;
  ps.ptrs[2]->grad_is_zero = true;  // zero_grad() since, no backward wrote it: stale memory
  const std::vector<float> stale = ps.ptrs[2]->grad.to_vector();
  const double expected = ps.naive_norm();  // without the absent one
  GradNormClipper clipper(ps.ptrs);
  clipper.clip(0.1f);
  EXPECT_NEAR(clipper.last_norm(), expected, 1e-5 * expected);
  EXPECT_EQ(ps.ptrs[2]->grad.to_vector(), stale);
  // A second call recomputes from scratch (the partials of the absent one are not left over).
  ps.ptrs[2]->grad_is_zero = false;
  ps.ptrs[0]->grad_is_zero = true;
  clipper.clip(0.f);
  EXPECT_NEAR(clipper.last_norm(), ps.naive_norm(), 1e-5 * ps.naive_norm());
}

// Parameters of a flat store (Note [Flat store]): the norm is one launch over the flat gradient
// and the scaling one more, with the bits of one launch per parameter (the same chunks).
TEST(GradNormClipper, AFlatStoreIsOneLaunchWithThePerParameterBits) {
  Params loose, flat;
  std::shared_ptr<FlatStore> store = FlatStore::of(flat.ptrs);
  for (size_t i = 0; i < flat.ptrs.size(); ++i)
    ASSERT_EQ(flat.ptrs[i]->grad.to_vector(), loose.ptrs[i]->grad.to_vector()) << "the store kept the gradients";
  GradNormClipper a(loose.ptrs), b(flat.ptrs);
  for (float max_norm : {0.1f, 0.f}) {
    const int64_t before_a = a.launches(), before_b = b.launches();
    a.clip(max_norm);
    b.clip(max_norm);
    EXPECT_EQ(a.result().to_vector(), b.result().to_vector()) << "norm and coefficient, bit for bit";
    for (size_t i = 0; i < flat.ptrs.size(); ++i)
      EXPECT_EQ(flat.ptrs[i]->grad.to_vector(), loose.ptrs[i]->grad.to_vector()) << i;
    const int64_t scale = max_norm > 0.f ? 1 : 0;
    EXPECT_EQ(b.launches() - before_b, 3 + scale) << "sums of squares, groups, coefficient (, scale)";
    EXPECT_EQ(a.launches() - before_a, 4 + 2 + 4 * scale);
  }
  // An absent gradient: the per-parameter path, which skips it.
  flat.ptrs[1]->grad_is_zero = loose.ptrs[1]->grad_is_zero = true;
  a.clip(0.1f);
  b.clip(0.1f);
  EXPECT_EQ(a.result().to_vector(), b.result().to_vector());
}

}  // namespace
}  // namespace dtrain
