// The GPT layers and the GPT model on the GPU against the same on the CPU: the CUDA builds of
// the LayerNorm, GELU and embedding functors and cuBLAS must give the CPU's outputs and
// gradients within float32 summation-order error; the embedding's backward, a gather in a
// fixed order, the same bits.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "model/activation.h"
#include "model/embedding.h"
#include "model/gpt.h"
#include "model/layernorm.h"
#include "model/loss.h"
#include "tests/gpu/gpu_test.h"

namespace dtrain {
namespace {

using testing::GpuTest;
using testing::max_rel_diff;

Tensor random_tensor(const Shape& shape, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-2.f, 2.f);
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (float& x : v) x = d(gen);
  return Tensor::from_vector(v, shape);
}

Tensor random_tokens(int64_t batch, int64_t seq, int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  Tensor t = Tensor::empty({batch, seq}, Device::cpu(), DType::kI32);
  for (int64_t i = 0; i < batch * seq; ++i) t.data_as<int32_t>()[i] = static_cast<int32_t>(gen() % vocab);
  return t;
}

class GpuGptParity : public GpuTest {};

// Widths a multiple of the warp's 32 lanes, past it unevenly, and below it (lanes with nothing).
TEST_F(GpuGptParity, LayerNormForwardAndBackwardMatchTheCpu) {
  for (int64_t c : {96, 100, 7}) {
    LayerNorm cpu(c, Device::cpu()), gpu_ln(c, gpu());
    const Tensor x = random_tensor({3, 37, c}, 1), dy = random_tensor({3, 37, c}, 2), res = random_tensor({3, 37, c}, 3);
    EXPECT_LT(max_rel_diff(cpu.forward(x), gpu_ln.forward(x.to(gpu()))), 1e-5) << "width " << c;
    EXPECT_LT(max_rel_diff(cpu.backward_add(dy, res), gpu_ln.backward_add(dy.to(gpu()), res.to(gpu()))), 1e-5)
        << "width " << c;
    for (size_t i = 0; i < 2; ++i)
      EXPECT_LT(max_rel_diff(cpu.parameters()[i]->grad, gpu_ln.parameters()[i]->grad), 1e-5) << i << ", width " << c;
  }
}

TEST_F(GpuGptParity, GeluMatchesTheCpu) {
  GELU cpu, gpu_gelu;
  const Tensor x = random_tensor({5, 301}, 4), dy = random_tensor({5, 301}, 5);
  EXPECT_LT(max_rel_diff(cpu.forward(x), gpu_gelu.forward(x.to(gpu()))), 1e-6);
  EXPECT_LT(max_rel_diff(cpu.backward(dy), gpu_gelu.backward(dy.to(gpu()))), 1e-6);
}

TEST_F(GpuGptParity, EmbeddingBackwardIsTheCpusBits) {
  TokenEmbedding cpu(300, 40, 24, Device::cpu()), gpu_e(300, 40, 24, gpu());
  gpu_e.wte().value.copy_from(cpu.wte().value);
  gpu_e.wpe().value.copy_from(cpu.wpe().value);
  const Tensor tokens = random_tokens(6, 33, 40, 6);  // few distinct tokens: long gathers
  const Tensor dy = random_tensor({6, 33, 24}, 7);
  EXPECT_EQ(cpu.forward(tokens).to_vector(), gpu_e.forward(tokens.to(gpu())).to_vector());
  cpu.wte().grad_is_zero = cpu.wpe().grad_is_zero = gpu_e.wte().grad_is_zero = gpu_e.wpe().grad_is_zero = true;
  cpu.backward(dy);
  gpu_e.backward(dy.to(gpu()));
  EXPECT_EQ(cpu.wte().grad.to_vector(), gpu_e.wte().grad.to_vector());
  EXPECT_EQ(cpu.wpe().grad.to_vector(), gpu_e.wpe().grad.to_vector());
}

// `backwards` > 1 accumulates the gradients of that many forward/backward passes (beta 1 in every
// layer, the tied head's scratch added into wte's gradient).
void expect_gpt_step_matches(AmpMode amp, double tolerance, Device gpu, int backwards = 1) {
  const GptSpec spec{97, 32, 2, 4, 64};
  auto cpu_model = build_gpt(spec, Device::cpu(), 9);
  auto gpu_model = build_gpt(spec, gpu, 9);
  cpu_model->set_amp(amp);
  gpu_model->set_amp(amp);
  const Tensor tokens = random_tokens(3, 29, spec.vocab, 10), targets = random_tokens(3 * 29, 1, spec.vocab, 11);
  const Tensor labels = targets.view({3 * 29});
  for (int pass = 0; pass < backwards; ++pass) {
    Tensor cpu_logits = cpu_model->forward(tokens), gpu_logits = gpu_model->forward(tokens.to(gpu));
    EXPECT_LT(max_rel_diff(cpu_logits, gpu_logits), tolerance) << "logits";
    CrossEntropyLoss cpu_loss, gpu_loss;
    EXPECT_LT(max_rel_diff(cpu_loss.forward(cpu_logits, labels), gpu_loss.forward(gpu_logits, labels.to(gpu))),
              tolerance);
    cpu_model->backward(cpu_loss.backward());
    gpu_model->backward(gpu_loss.backward());
  }
  auto cp = cpu_model->parameters(), gp = gpu_model->parameters();
  ASSERT_EQ(cp.size(), gp.size());
  for (size_t i = 0; i < cp.size(); ++i)
    EXPECT_LT(max_rel_diff(cp[i]->grad, gp[i]->grad), 10 * tolerance) << "gradient of " << cp[i]->name;
}

TEST_F(GpuGptParity, GptStepMatchesTheCpu) { expect_gpt_step_matches(AmpMode::kOff, 1e-5, gpu()); }

TEST_F(GpuGptParity, GptBf16AmpStepMatchesTheCpuEmulation) { expect_gpt_step_matches(AmpMode::kBf16, 1e-3, gpu()); }

TEST_F(GpuGptParity, GptFp16AmpStepMatchesTheCpuEmulation) { expect_gpt_step_matches(AmpMode::kFp16, 1e-3, gpu()); }

TEST_F(GpuGptParity, GptGradientsAccumulateAsTheCpus) { expect_gpt_step_matches(AmpMode::kOff, 1e-5, gpu(), 2); }

}  // namespace
}  // namespace dtrain
