// The built-in models on the GPU against the same models on the CPU: the CUDA builds of the
// layer functors (Conv2d's batched im2col and col2im, pooling, the fused loss, SGD) and cuBLAS
// must give the CPU's logits, loss, gradients and updated parameters within float32
// summation-order error, and --amp bf16 the CPU's emulation of it within bf16 rounding.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "model/amp.h"
#include "model/flat_store.h"
#include "model/grad_clip.h"
#include "model/grad_scaler.h"
#include "model/loss.h"
#include "model/models.h"
#include "model/optimizer.h"
#include "tests/gpu/gpu_test.h"

namespace dtrain {
namespace {

using testing::GpuTest;
using testing::max_rel_diff;

struct Batch {
  Tensor images, labels;
};

Batch random_batch(int64_t batch, Device device) {
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> pixel(0.f, 1.f);
  std::vector<float> pixels(static_cast<size_t>(batch * 28 * 28));
  for (float& p : pixels) p = pixel(gen);
  Tensor labels = Tensor::empty({batch}, Device::cpu(), DType::kI32);
  for (int64_t i = 0; i < batch; ++i) labels.data_as<int32_t>()[i] = static_cast<int32_t>(gen() % 10);
  return {Tensor::from_vector(pixels, {batch, 1, 28, 28}).to(device), labels.to(device)};
}

// One forward, backward and SGD step of the same model on both devices, compared at each stage.
void expect_step_matches(const ModelSpec& spec, AmpMode amp, double tolerance, Device gpu) {
  auto cpu_model = build_model(spec, {1, 28, 28}, 10, Device::cpu(), 7);
  auto gpu_model = build_model(spec, {1, 28, 28}, 10, gpu, 7);
  cpu_model->set_amp(amp);
  gpu_model->set_amp(amp);
  const int64_t batch = 37;  // odd, so no kernel gets a convenient multiple
  Batch cpu_batch = random_batch(batch, Device::cpu()), gpu_batch = random_batch(batch, gpu);

  Tensor cpu_logits = cpu_model->forward(cpu_batch.images);
  Tensor gpu_logits = gpu_model->forward(gpu_batch.images);
  EXPECT_LT(max_rel_diff(cpu_logits, gpu_logits), tolerance) << model_kind_name(spec.kind) << " logits";
  CrossEntropyLoss cpu_loss, gpu_loss;
  EXPECT_LT(max_rel_diff(cpu_loss.forward(cpu_logits, cpu_batch.labels), gpu_loss.forward(gpu_logits, gpu_batch.labels)),
            tolerance)
      << model_kind_name(spec.kind) << " loss";
  cpu_model->backward(cpu_loss.backward(), false);
  gpu_model->backward(gpu_loss.backward(), false);
  auto cpu_params = cpu_model->parameters(), gpu_params = gpu_model->parameters();
  ASSERT_EQ(cpu_params.size(), gpu_params.size());
  for (size_t i = 0; i < cpu_params.size(); ++i)
    EXPECT_LT(max_rel_diff(cpu_params[i]->grad, gpu_params[i]->grad), 10 * tolerance)
        << model_kind_name(spec.kind) << " gradient of " << cpu_params[i]->name;

  SgdOptions options;
  options.lr = 0.1f;
  options.momentum = 0.9f;
  Sgd cpu_sgd(cpu_params, options), gpu_sgd(gpu_params, options);
  cpu_sgd.step();
  gpu_sgd.step();
  for (size_t i = 0; i < cpu_params.size(); ++i)
    EXPECT_LT(max_rel_diff(cpu_params[i]->value, gpu_params[i]->value), tolerance)
        << model_kind_name(spec.kind) << " updated " << cpu_params[i]->name;
  // BatchNorm's running statistics (model/norm_kernels.h) and its int64 counter.
  auto cpu_buffers = cpu_model->buffers(), gpu_buffers = gpu_model->buffers();
  ASSERT_EQ(cpu_buffers.size(), gpu_buffers.size());
  for (size_t i = 0; i < cpu_buffers.size(); ++i) {
    if (cpu_buffers[i]->value.dtype() == DType::kI64) {
      EXPECT_EQ(*gpu_buffers[i]->value.to(Device::cpu()).data_as<int64_t>(), 1) << gpu_buffers[i]->name;
      continue;
    }
    EXPECT_LT(max_rel_diff(cpu_buffers[i]->value, gpu_buffers[i]->value), tolerance)
        << model_kind_name(spec.kind) << " buffer " << cpu_buffers[i]->name;
  }
  // Evaluation: the running statistics normalise.
  cpu_model->set_training(false);
  gpu_model->set_training(false);
  EXPECT_LT(max_rel_diff(cpu_model->forward(cpu_batch.images), gpu_model->forward(gpu_batch.images)), tolerance)
      << model_kind_name(spec.kind) << " logits in evaluation";
}

class GpuModelParity : public GpuTest {};

TEST_F(GpuModelParity, MlpStepMatchesTheCpu) {
  expect_step_matches(ModelSpec{ModelKind::kMlp, {256}, 0.f}, AmpMode::kOff, 1e-5, gpu());
}

// BatchNorm (batch statistics, running statistics, the fused ReLU and its mask recomputed from
// the input), BasicBlock's join and the chained joins' AddMasked (Note [Chained joins]), global
// average pooling, convolutions without bias: a step within float32 summation-order error.
TEST_F(GpuModelParity, Resnet18StepMatchesTheCpu) {
  ModelSpec spec;
  spec.kind = ModelKind::kResnet18;
  spec.width = 4;
  expect_step_matches(spec, AmpMode::kOff, 1e-4, gpu());
}

TEST_F(GpuModelParity, CnnStepMatchesTheCpu) {
  expect_step_matches(ModelSpec{ModelKind::kCnn, {}, 0.f}, AmpMode::kOff, 1e-5, gpu());
}

// bf16 operands are the same on both devices; only the fp32 accumulation order differs.
TEST_F(GpuModelParity, MlpBf16AmpStepMatchesTheCpuEmulation) {
  expect_step_matches(ModelSpec{ModelKind::kMlp, {256}, 0.f}, AmpMode::kBf16, 1e-3, gpu());
}

// The same for fp16 (cuBLAS GemmEx on CUDA_R_16F against the CPU's rounded operands), and the
// CNN's Conv2d layers in both formats.
TEST_F(GpuModelParity, MlpFp16AmpStepMatchesTheCpuEmulation) {
  expect_step_matches(ModelSpec{ModelKind::kMlp, {256}, 0.f}, AmpMode::kFp16, 1e-3, gpu());
}

TEST_F(GpuModelParity, CnnFp16AmpStepMatchesTheCpuEmulation) {
  expect_step_matches(ModelSpec{ModelKind::kCnn, {}, 0.f}, AmpMode::kFp16, 1e-3, gpu());
}

TEST_F(GpuModelParity, CnnBf16AmpStepMatchesTheCpuEmulation) {
  expect_step_matches(ModelSpec{ModelKind::kCnn, {}, 0.f}, AmpMode::kBf16, 1e-2, gpu());
}

// --class-weights: the weighted mean (sum w[y] l / sum w[y]) and its gradient, the weights kept on
// the device, as the CPU's fused pass computes them; a second batch (smaller) reuses the weights.
TEST_F(GpuModelParity, ClassWeightedCrossEntropyMatchesTheCpu) {
  const std::vector<float> weights = {0.5f, 1.f, 2.f, 0.f, 3.f, 0.25f, 1.f, 1.5f, 1.f, 0.75f};
  CrossEntropyLoss cpu_loss(Reduction::kMean, weights), gpu_loss(Reduction::kMean, weights);
  for (int64_t rows : {37, 5}) {
    std::mt19937 gen(static_cast<uint32_t>(rows));
    std::normal_distribution<float> normal(0.f, 3.f);
    std::vector<float> z(static_cast<size_t>(rows * 10));
    for (float& v : z) v = normal(gen);
    Tensor labels = Tensor::empty({rows}, Device::cpu(), DType::kI32);
    for (int64_t i = 0; i < rows; ++i) labels.data_as<int32_t>()[i] = static_cast<int32_t>(gen() % 10);
    const Tensor logits = Tensor::from_vector(z, {rows, 10});
    const Tensor cpu = cpu_loss.forward(logits, labels), dev = gpu_loss.forward(logits.to(gpu()), labels.to(gpu()));
    EXPECT_LT(max_rel_diff(cpu, dev), 1e-5) << rows << " rows: loss";
    EXPECT_LT(max_rel_diff(cpu_loss.backward(), gpu_loss.backward()), 1e-5) << rows << " rows: gradient";
  }
}

// GradScaler's unscale-and-check on the GPU: the same bits as the CPU, the same finding.
TEST_F(GpuModelParity, GradScalerUnscaleMatchesTheCpu) {
  std::vector<float> g(70000);
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.f, 1000.f);
  for (float& v : g) v = normal(gen);
  for (bool poisoned : {false, true}) {
    if (poisoned) g[65537] = std::numeric_limits<float>::infinity();
    Tensor cpu = Tensor::from_vector(g, {70000}), dev = cpu.to(gpu());
    GradScaler cpu_scaler(GradScalerSettings{}, Device::cpu()), gpu_scaler(GradScalerSettings{}, gpu());
    const std::vector<GradSpan> cpu_spans = {{cpu.data(), 70000}}, gpu_spans = {{dev.data(), 70000}};
    cpu_scaler.unscale(cpu_spans);
    gpu_scaler.unscale(gpu_spans);
    EXPECT_EQ(gpu_scaler.read_found_inf(), cpu_scaler.read_found_inf()) << "poisoned " << poisoned;
    EXPECT_EQ(gpu_scaler.read_found_inf() > 0.f, poisoned);
    EXPECT_EQ(dev.to_vector(), cpu.to_vector()) << "x * 2^-16 is exact on both";
  }
}

// --clip-grad-norm over a flat store (one SumSquaresSpans launch for every parameter) on the
// GPU: the CPU's norm and clipped gradients within float32 summation-order error.
TEST_F(GpuModelParity, FlatStoreGradClipMatchesTheCpu) {
  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<std::unique_ptr<Parameter>> cpu_owned, gpu_owned;
  std::vector<Parameter*> cpu_params, gpu_params;
  for (int64_t n : {3, 1024, 70001, 1, 4096}) {
    std::vector<float> g(static_cast<size_t>(n));
    for (float& v : g) v = normal(gen);
    cpu_owned.push_back(std::make_unique<Parameter>(Parameter{"p", Tensor::zeros({n}), Tensor::from_vector(g, {n})}));
    gpu_owned.push_back(std::make_unique<Parameter>(
        Parameter{"p", Tensor::zeros({n}, gpu()), Tensor::from_vector(g, {n}).to(gpu())}));
    cpu_params.push_back(cpu_owned.back().get());
    gpu_params.push_back(gpu_owned.back().get());
  }
  std::shared_ptr<FlatStore> cpu_store = FlatStore::of(cpu_params), gpu_store = FlatStore::of(gpu_params);
  GradNormClipper cpu_clip(cpu_params), gpu_clip(gpu_params);
  cpu_clip.clip(1.f);
  gpu_clip.clip(1.f);
  EXPECT_EQ(gpu_clip.launches(), 4) << "one launch for the sums of squares, one for the scaling";
  EXPECT_NEAR(gpu_clip.last_norm(), cpu_clip.last_norm(), 1e-5 * cpu_clip.last_norm());
  for (size_t i = 0; i < cpu_params.size(); ++i)
    EXPECT_LT(max_rel_diff(cpu_params[i]->grad, gpu_params[i]->grad), 1e-5) << "clipped gradient " << i;
}

}  // namespace
}  // namespace dtrain
