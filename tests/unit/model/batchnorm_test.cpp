// BatchNorm, global average pooling and BasicBlock: gradients against central differences
// (tests/unit/model/gradcheck.h; BatchNorm is smooth, not piecewise linear, so h is smaller and
// the tolerance wider), the running statistics' update and evaluation mode, resnet18's names.
#include "gradcheck.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include <fmt/format.h>

#include "core/ops.h"
#include "model/batchnorm.h"
#include "model/cpu_norm.h"
#include "model/models.h"
#include "model/norm_kernels.h"
#include "model/resnet.h"

namespace dtrain {
namespace {

using testing::expect_gradients_match;
using testing::random_values;

constexpr float kH = 2e-3f;
constexpr double kTol = 3e-3;

Tensor random_input(const Shape& shape, uint32_t seed) {
  return Tensor::from_vector(random_values(static_cast<size_t>(shape_numel(shape)), seed), shape);
}

// A BatchNorm whose weight and bias are not 1 and 0 (so their gradients' terms all matter).
void perturb_affine(BatchNorm& bn, uint32_t seed) {
  for (Parameter* p : bn.parameters()) {
    std::vector<float> v = random_values(static_cast<size_t>(p->value.numel()), seed++, 0.5f, 1.5f);
    p->value.copy_from(Tensor::from_vector(v, p->value.shape()));
  }
}

TEST(GradCheck, BatchNorm2d) {
  BatchNorm bn(3, 2, Device::cpu());
  perturb_affine(bn, 11);
  expect_gradients_match(bn, random_input({4, 3, 3, 2}, 1), kH, kTol, kTol);
}

TEST(GradCheck, BatchNorm1d) {
  BatchNorm bn(5, 1, Device::cpu());
  perturb_affine(bn, 12);
  expect_gradients_match(bn, random_input({6, 5}, 2), kH, kTol, kTol);
}

TEST(GradCheck, BatchNorm2dWithFusedRelu) {
  BatchNorm bn(2, 2, Device::cpu());
  perturb_affine(bn, 13);
  bn.absorb_following_relu();
  expect_gradients_match(bn, random_input({3, 2, 2, 3}, 3), kH, kTol, kTol);
}

TEST(GradCheck, GlobalAvgPool) {
  GlobalAvgPool pool;
  expect_gradients_match(pool, random_input({2, 3, 3, 4}, 4));
}

TEST(GradCheck, BasicBlockWithDownsample) {
  InitRng rng(5);
  BasicBlock block(2, 3, 2, Device::cpu(), rng);
  expect_gradients_match(block, random_input({3, 2, 5, 5}, 6), kH, kTol, kTol);
}

TEST(GradCheck, BasicBlockIdentity) {
  InitRng rng(6);
  BasicBlock block(2, 2, 1, Device::cpu(), rng);
  expect_gradients_match(block, random_input({3, 2, 4, 4}, 7), kH, kTol, kTol);
}

// Note [Chained joins]: a pair of blocks chained (the later applies the earlier's join ReLU in
// its Add; the earlier skips its ReluBackward) gives the unchained pair's gradients bitwise, the
// input's and every parameter's; the first block downsamples (its identity branch takes the
// masked gradient too), the second adds the identity.
TEST(Resnet18, ChainedJoinsGiveTheUnchainedGradientsBitwise) {
  auto gradients = [](bool chained) {
    InitRng rng(21);
    BasicBlock a(2, 3, 2, Device::cpu(), rng), b(3, 3, 1, Device::cpu(), rng);
    if (chained) BasicBlock::chain(&a, &b);
    const Tensor h = a.forward(random_input({3, 2, 6, 6}, 22));
    const std::vector<float> hv = h.to_vector();
    EXPECT_GT(std::count(hv.begin(), hv.end(), 0.f), 0);  // the earlier join's ReLU cut some
    const Tensor y = b.forward(h);
    std::vector<std::vector<float>> out = {a.backward(b.backward(random_input(y.shape(), 23))).to_vector()};
    for (BasicBlock* m : {&a, &b})
      for (Parameter* p : m->parameters()) out.push_back(p->grad.to_vector());
    return out;
  };
  EXPECT_EQ(gradients(false), gradients(true));
}

// PyTorch: running = 0.9 running + 0.1 batch, the variance unbiased; num_batches_tracked counts
// training forwards; evaluation normalises with the running statistics and changes nothing.
TEST(BatchNorm, RunningStatisticsAsPyTorch) {
  BatchNorm bn(1, 1, Device::cpu());
  const std::vector<float> x = {1.f, 2.f, 3.f, 6.f};  // mean 3, biased var 3.5, unbiased 14/3
  Tensor in = Tensor::from_vector(x, {4, 1});
  bn.forward(in);
  std::vector<Buffer*> b = bn.buffers();
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0]->name, "running_mean");
  EXPECT_FLOAT_EQ(b[0]->value.to_vector()[0], 0.3f);
  EXPECT_FLOAT_EQ(b[1]->value.to_vector()[0], 0.9f + 0.1f * 14.f / 3.f);
  EXPECT_EQ(b[2]->name, "num_batches_tracked");
  EXPECT_EQ(b[2]->value.dtype(), DType::kI64);
  EXPECT_EQ(*b[2]->value.data_as<int64_t>(), 1);
  bn.set_training(false);
  const std::vector<float> y = bn.forward(in).to_vector();
  const float rm = 0.3f, rv = 0.9f + 0.1f * 14.f / 3.f;
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], (x[i] - rm) / std::sqrt(rv + 1e-5f), 1e-6);
  EXPECT_EQ(*b[2]->value.data_as<int64_t>(), 1);
  EXPECT_FLOAT_EQ(b[0]->value.to_vector()[0], 0.3f);
}

TEST(BatchNorm, OneValuePerChannelInTrainingIsRefused) {
  BatchNorm bn(2, 1, Device::cpu());
  const std::vector<float> one_sample = {1.f, 2.f};
  EXPECT_THROW(bn.forward(Tensor::from_vector(one_sample, {1, 2})), Error);
}

// torchvision's names and shapes, as ../shared/peers/torch_resnet_peer.py has them, and the plan
// agrees with the built model.
TEST(Resnet18, TorchvisionNamesAndThePlan) {
  ModelSpec spec{.kind = ModelKind::kResnet18, .width = 4};
  auto model = build_model(spec, {1, 28, 28}, 10, Device::cpu(), 0);
  std::vector<std::string> names;
  for (Parameter* p : model->parameters()) names.push_back(p->name);
  for (Buffer* b : model->buffers()) names.push_back(b->name);
  const std::set<std::string> got(names.begin(), names.end());
  for (const char* want : {"conv1.weight", "bn1.weight", "bn1.running_mean", "bn1.num_batches_tracked",
                           "layer1.0.conv1.weight", "layer1.1.bn2.running_var", "layer2.0.downsample.0.weight",
                           "layer2.0.downsample.1.weight", "layer4.1.bn2.bias", "fc.weight", "fc.bias"})
    EXPECT_TRUE(got.count(want)) << want;
  EXPECT_FALSE(got.count("layer1.0.downsample.0.weight"));  // layer1 keeps the width and stride
  EXPECT_FALSE(got.count("conv1.bias"));
  EXPECT_EQ(model->parameters().size(), 62u);  // torchvision's resnet18 has 62 parameter tensors
  EXPECT_EQ(model->buffers().size(), 60u);     // 20 BatchNorms x 3
  std::vector<std::string> planned;
  int64_t count = 0;
  for (const LayerSize& l : plan_model(spec, {1, 28, 28}, 10)) {
    count += l.parameters;
    for (const ParameterShape& t : l.tensors) planned.push_back(t.name);
  }
  EXPECT_EQ(planned, std::vector<std::string>(names.begin(), names.begin() + 62));
  int64_t built = 0;
  for (Parameter* p : model->parameters()) built += p->value.numel();
  EXPECT_EQ(count, built);
  // The plan's buffers are the built ones, named, shaped and typed alike (a pipeline's checkpoint
  // lists them without building the model: Note [Pipeline checkpoints]).
  std::vector<std::string> planned_buffers, built_buffers;
  for (const LayerSize& l : plan_model(spec, {1, 28, 28}, 10))
    for (const BufferShape& b : l.buffers)
      planned_buffers.push_back(fmt::format("{} {} {}", b.name, shape_str(b.shape), static_cast<int>(b.dtype)));
  for (Buffer* b : model->buffers())
    built_buffers.push_back(
        fmt::format("{} {} {}", b->name, shape_str(b->value.shape()), static_cast<int>(b->value.dtype())));
  EXPECT_EQ(planned_buffers, built_buffers);
}

}  // namespace
}  // namespace dtrain

namespace dtrain {
namespace {

// The CPU's per-plane loops compute the GPU's per-element floats, bitwise.
TEST(BatchNormKernels, PlanesEqualElementsBitwise) {
  const int64_t n = 3, c = 4, plane = 7, count = n * c * plane;
  const std::vector<float> x = testing::random_values(count, 1), dy = testing::random_values(count, 2);
  const std::vector<float> per_c = testing::random_values(c, 3), per_c2 = testing::random_values(c, 4);
  for (bool relu : {false, true}) {
    std::vector<float> a(count), b(count);
    launch(Device::cpu(), count, kernels::BatchNormApply{{a.data(), x.data(), per_c.data(), per_c2.data(), c, plane, relu}});
    launch(Device::cpu(), n * c,
           kernels::BatchNormApplyPlanes{b.data(), x.data(), per_c.data(), per_c2.data(), c, plane, relu});
    EXPECT_EQ(a, b) << "apply, relu " << relu;
    const kernels::ReluMask y = relu ? kernels::ReluMask{per_c.data(), per_c2.data()} : kernels::ReluMask{};
    std::vector<float> da(count), db(count);
    launch(Device::cpu(), count,
           kernels::BatchNormBackwardInput{{da.data(), dy.data(), y, x.data(), per_c.data(), per_c2.data(),
                                            per_c.data(), per_c2.data(), c, plane}});
    launch(Device::cpu(), n * c,
           kernels::BatchNormBackwardInputPlanes{db.data(), dy.data(), y, x.data(), per_c.data(), per_c2.data(),
                                                 per_c.data(), per_c2.data(), c, plane});
    EXPECT_EQ(da, db) << "backward input, relu " << relu;
  }
  std::vector<float> pa(count), pb(count);
  launch(Device::cpu(), count, kernels::GlobalAvgPoolBackward{pa.data(), dy.data(), plane});
  launch(Device::cpu(), n * c, kernels::GlobalAvgPoolBackwardPlanes{pb.data(), dy.data(), plane});
  EXPECT_EQ(pa, pb) << "global average pooling's backward";
}


// Note [Shifted statistics]: one pass about the channel's first value keeps the two passes'
// floats where E[x^2] - E[x]^2 would cancel: channels around 1e5 with spread ~1 (1e10 between
// the squares and the variance; about 0, in double, the variance would be off by ~1e-6), the row
// kernel's CPU lane and every set of cpu::batchnorm_stats' loops against the two passes in double.
TEST(BatchNormKernels, ShiftedStatisticsKeepTheTwoPassesFloats) {
  const int64_t n = 6, c = 3, plane = 9, count = n * c * plane;
  std::vector<float> x = testing::random_values(count, 31, -1.f, 1.f);
  for (int64_t i = 0; i < count; ++i) x[i] += 1e5f + 300.f * static_cast<float>((i / plane) % c);
  std::vector<float> want_mean(c), want_invstd(c);
  for (int64_t ch = 0; ch < c; ++ch) {
    double sum = 0.0, squares = 0.0;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t p = 0; p < plane; ++p) sum += x[(b * c + ch) * plane + p];
    const double m = sum / static_cast<double>(n * plane);
    for (int64_t b = 0; b < n; ++b)
      for (int64_t p = 0; p < plane; ++p) {
        const double d = x[(b * c + ch) * plane + p] - m;
        squares += d * d;
      }
    want_mean[ch] = static_cast<float>(m);
    want_invstd[ch] = static_cast<float>(1.0 / std::sqrt(squares / static_cast<double>(n * plane) + 1e-5));
  }
  const std::vector<float> weight(c, 1.f), bias(c, 0.f);
  auto check = [&](const char* what, auto&& run) {
    std::vector<float> mean(c), invstd(c), alpha(c), shift(c), rm(c, 0.f), rv(c, 1.f);
    run(kernels::BatchNormStats{mean.data(), invstd.data(), alpha.data(), shift.data(), rm.data(), rv.data(), x.data(),
                                weight.data(), bias.data(), n, c, plane, 1e-5f, 0.1f});
    EXPECT_EQ(mean, want_mean) << what;
    EXPECT_EQ(invstd, want_invstd) << what;
  };
  check("row kernel", [](const kernels::BatchNormStats& k) { launch_rows(Device::cpu(), k.channels, k); });
  for (const char* isa : {"avx2", "generic"})
    if (cpu::select_norm_isa(isa)) check(isa, [](const kernels::BatchNormStats& k) { cpu::batchnorm_stats(k); });
  cpu::select_norm_isa("");
}

// Note [ReLU mask from the input]: backward's mask, recomputed from x and forward's alpha and
// shift, is exactly where the fused ReLU's output is positive, on the CPU's planes and the GPU's
// elements; values landing exactly on 0 (x = 0 with shift 0) and NaN (x = 0 times an infinite
// alpha) are masked as the output's zeros are.
TEST(BatchNormKernels, ReluMaskFromTheInputIsTheOutputsMask) {
  const int64_t n = 3, c = 4, plane = 7, count = n * c * plane;
  std::vector<float> x = testing::random_values(count, 1), alpha = testing::random_values(c, 3),
                     shift = testing::random_values(c, 4);
  shift[0] = 0.f;
  for (int64_t i = 0; i < plane; i += 2) x[i] = 0.f;  // channel 0: exactly 0 after the affine
  alpha[1] = INFINITY;
  x[plane] = 0.f;  // channel 1: NaN
  std::vector<float> planes(count), elements(count);
  launch(Device::cpu(), n * c,
         kernels::BatchNormApplyPlanes{planes.data(), x.data(), alpha.data(), shift.data(), c, plane, true});
  launch(Device::cpu(), count,
         kernels::BatchNormApply{{elements.data(), x.data(), alpha.data(), shift.data(), c, plane, true}});
  const kernels::ReluMask mask{alpha.data(), shift.data()};
  int64_t kept = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t ch = (i / plane) % c;
    EXPECT_EQ(mask.keeps(x[i], ch), planes[i] > 0.f) << i;
    EXPECT_EQ(mask.keeps(x[i], ch), elements[i] > 0.f) << i;
    kept += mask.keeps(x[i], ch);
  }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, count);
}

// Note [Fused residual join]: the normalising pass with the identity added before the ReLU gives
// bn2's output followed by AddRelu's, bitwise, on the CPU's planes and the GPU's elements.
TEST(BatchNormKernels, ResidualJoinEqualsApplyThenAddReluBitwise) {
  const int64_t n = 3, c = 4, plane = 7, count = n * c * plane;
  const std::vector<float> x = testing::random_values(count, 1), r = testing::random_values(count, 2);
  const std::vector<float> alpha = testing::random_values(c, 3), shift = testing::random_values(c, 4);
  std::vector<float> main(count), want(count), planes(count), elements(count);
  launch(Device::cpu(), n * c,
         kernels::BatchNormApplyPlanes{main.data(), x.data(), alpha.data(), shift.data(), c, plane, false});
  launch(Device::cpu(), count, kernels::AddRelu{want.data(), main.data(), r.data()});
  launch(Device::cpu(), n * c,
         kernels::BatchNormApplyPlanes{planes.data(), x.data(), alpha.data(), shift.data(), c, plane, true, r.data()});
  launch(Device::cpu(), count,
         kernels::BatchNormApply{{elements.data(), x.data(), alpha.data(), shift.data(), c, plane, true, r.data()}});
  EXPECT_EQ(want, planes);
  EXPECT_EQ(want, elements);
  EXPECT_GT(std::count(want.begin(), want.end(), 0.f), 0);  // the ReLU cut some
}

// The CPU loops of model/cpu_norm.h compute the row kernels' CPU lane (OneLane, launch_rows on the
// CPU) bitwise: statistics with and without the running update, backward's sums with and without
// the fused ReLU's mask (y has zeros, negatives and a NaN), gradients written and accumulated,
// over planes that leave a tail after the groups of four (1, 3, 7) and that do not (4, 16), and
// batches of fewer planes than cpu_norm.cpp's groups (3) and of groups with a tail (9, 12), with
// each set of loops this CPU runs (AVX2 intrinsics, the generic vectors).
TEST(BatchNormKernels, CpuReductionsEqualTheRowKernelsBitwise) {
  for (const char* isa : {"avx2", "generic"}) {
  if (!cpu::select_norm_isa(isa)) continue;
  SCOPED_TRACE(isa);
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  for (int64_t n : {3, 9, 12})
  for (int64_t plane : {1, 3, 4, 7, 16}) {
    const int64_t c = 5, count = n * c * plane;
    std::vector<float> x = testing::random_values(count, 1, -2.f, 3.f), dy = testing::random_values(count, 2);
    // The fused ReLU's coefficients (Note [ReLU mask from the input]): channel 0's value at x[0]
    // exactly 0 (masked: > 0, not >= 0), channel 1's NaN at x = 0 (infinite alpha; masked too).
    std::vector<float> relu_alpha = testing::random_values(c, 5), relu_shift = testing::random_values(c, 8);
    x[0] = 0.f;
    relu_shift[0] = 0.f;
    relu_alpha[1] = INFINITY;
    x[plane] = 0.f;  // channel 1's first value
    const std::vector<float> weight = testing::random_values(c, 3, 0.5f, 1.5f), bias = testing::random_values(c, 4);
    for (bool running : {false, true}) {
      // [mean, invstd, alpha, shift, running_mean, running_var] per side
      std::vector<std::vector<float>> want(6, std::vector<float>(c, 0.25f)), got = want;
      auto stats = [&](std::vector<std::vector<float>>& o) {
        return kernels::BatchNormStats{o[0].data(), o[1].data(), o[2].data(), o[3].data(),
                                       running ? o[4].data() : nullptr, o[5].data(), x.data(), weight.data(),
                                       bias.data(), n, c, plane, 1e-5f, 0.1f};
      };
      launch_rows(Device::cpu(), c, stats(want));
      cpu::batchnorm_stats(stats(got));
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_TRUE(same(want[i], got[i])) << "statistics output " << i << ", plane " << plane << ", running " << running;
    }
    const std::vector<float> mean = testing::random_values(c, 6), invstd = testing::random_values(c, 7, 0.5f, 2.f);
    for (bool relu : {false, true})
      for (float beta : {0.f, 1.f}) {
        // [grad_weight, grad_bias, sum_dy, sum_dy_xmu] per side
        std::vector<std::vector<float>> want(4, std::vector<float>(c, beta == 0.f ? NAN : 0.5f)), got = want;
        auto reduce = [&](std::vector<std::vector<float>>& o) {
          const kernels::ReluMask mask = relu ? kernels::ReluMask{relu_alpha.data(), relu_shift.data()}
                                              : kernels::ReluMask{};
          return kernels::BatchNormBackwardReduce{o[0].data(), o[1].data(), o[2].data(), o[3].data(), dy.data(),
                                                  mask, x.data(), mean.data(), invstd.data(),
                                                  n, c, plane, beta, beta};
        };
        launch_rows(Device::cpu(), c, reduce(want));
        cpu::batchnorm_backward_reduce(reduce(got));
        for (size_t i = 0; i < want.size(); ++i)
          EXPECT_TRUE(same(want[i], got[i])) << "backward output " << i << ", plane " << plane << ", relu " << relu
                                             << ", beta " << beta;
      }
  }
  }
  cpu::select_norm_isa("");
}

}  // namespace
}  // namespace dtrain
