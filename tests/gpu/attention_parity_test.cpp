// CausalSelfAttention on the GPU against the same layer on the CPU (model/attention.h): the CUDA
// builds of its kernels (heads re-layout, causal softmax forward and backward) and cuBLAS's strided
// batched products must give the CPU's output, input gradient and parameter gradients within
// float32 summation-order error, across several causal blocks (T = 130) and in one (T = 5);
// also gemm_batched itself against gemm() product by product.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/ops.h"
#include "model/attention.h"
#include "tests/gpu/gpu_test.h"

namespace dtrain {
namespace {

using testing::GpuTest;
using testing::max_rel_diff;

std::vector<float> uniform(size_t n, uint32_t seed, float a) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-a, a);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

void expect_layer_matches(int64_t B, int64_t T, int64_t C, int64_t H, Device gpu) {
  InitRng cpu_rng(3), gpu_rng(3);
  CausalSelfAttention cpu_layer(C, H, T, Device::cpu(), cpu_rng, 0.1f);
  CausalSelfAttention gpu_layer(C, H, T, gpu, gpu_rng, 0.1f);
  auto cpu_params = cpu_layer.parameters(), gpu_params = gpu_layer.parameters();
  for (size_t i = 0; i < cpu_params.size(); ++i) {  // O(1) scores: a softmax far from uniform
    const Tensor w = Tensor::from_vector(uniform(static_cast<size_t>(cpu_params[i]->value.numel()), 10 + i, 0.5f),
                                         cpu_params[i]->value.shape());
    cpu_params[i]->value.copy_from(w);
    gpu_params[i]->value.copy_from(w);
    cpu_params[i]->grad_is_zero = gpu_params[i]->grad_is_zero = true;
  }
  const Tensor x = Tensor::from_vector(uniform(static_cast<size_t>(B * T * C), 1, 1.f), {B, T, C});
  const Tensor dy = Tensor::from_vector(uniform(static_cast<size_t>(B * T * C), 2, 1.f), {B, T, C});
  const double tolerance = 1e-5;
  EXPECT_LT(max_rel_diff(cpu_layer.forward(x), gpu_layer.forward(x.to(gpu))), tolerance) << "output, T " << T;
  EXPECT_LT(max_rel_diff(cpu_layer.backward(dy, true), gpu_layer.backward(dy.to(gpu), true)), 10 * tolerance)
      << "input gradient, T " << T;
  for (size_t i = 0; i < cpu_params.size(); ++i)
    EXPECT_LT(max_rel_diff(cpu_params[i]->grad, gpu_params[i]->grad), 10 * tolerance)
        << cpu_params[i]->name << ", T " << T;
}

class AttentionParity : public GpuTest {};

TEST_F(AttentionParity, ForwardAndBackwardMatchTheCpuAcrossCausalBlocks) {
  expect_layer_matches(3, 130, 32, 4, gpu());
  expect_layer_matches(2, 5, 8, 2, gpu());
}

TEST_F(AttentionParity, GemmBatchedEqualsGemmPerProduct) {
  const int64_t m = 40, n = 24, k = 16, count = 5;  // products stored back to back
  const std::vector<float> a = uniform(static_cast<size_t>(count * m * k), 4, 1.f);
  const std::vector<float> b = uniform(static_cast<size_t>(count * n * k), 5, 1.f);
  const Tensor ga = Tensor::from_vector(a, {count, m, k}).to(gpu());
  const Tensor gb = Tensor::from_vector(b, {count, n, k}).to(gpu());
  Tensor batched = Tensor::zeros({count, m, n}, gpu()), single = Tensor::zeros({count, m, n}, gpu());
  gemm_batched(gpu(), false, true, m, n, k, 0.5f, ga.data(), k, gb.data(), k, 0.f, batched.data(), n,
               {count, m * k, n * k, m * n});
  for (int64_t i = 0; i < count; ++i)
    gemm(gpu(), false, true, m, n, k, 0.5f, ga.data() + i * m * k, gb.data() + i * n * k, 0.f,
         single.data() + i * m * n);
  EXPECT_LT(max_rel_diff(single.to(Device::cpu()), batched), 1e-6);
}

}  // namespace
}  // namespace dtrain
