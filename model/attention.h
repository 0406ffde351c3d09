// CausalSelfAttention: nanoGPT's multi-head self-attention with a causal mask. x is (B, T, C),
// T <= context: qkv = c_attn(x) (C -> 3C), split along the last dim into q | k | v, each cut into
// H heads of hs = C / H; per head att = softmax(q k^T / sqrt(hs)) over keys u <= t, y = att v;
// heads re-joined to (B, T, C), out = c_proj(y) (C -> C). Parameters (local names, a container
// prefixes them): c_attn.weight [3C, C], c_attn.bias [3C], c_proj.weight [C, C], c_proj.bias [C];
// GPT-2's init: weights normal(0, 0.02), c_proj.weight normal(0, proj_std), biases zero.
// The T x T probabilities are kept for backward (B*H*T*T floats; their gradient as many again on
// the GPU, one head's T x T on the CPU).
// With AmpMode::kBf16 or kFp16 the two Linear layers run in 16 bits; the attention products stay float32.
#pragma once

#include <cstdint>

#include "model/init.h"
#include "model/linear.h"
#include "model/module.h"

namespace dtrain {

class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t embd, int64_t heads, int64_t context, Device device, InitRng& rng, float proj_std);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, bool need_input_grad = true) override;
  std::vector<Parameter*> parameters() override;  // c_attn.weight, c_attn.bias, c_proj.weight, c_proj.bias
  std::string describe() const override;
  void set_amp(AmpMode mode) override;
  void set_grad_ready_hook(GradReadyHook hook) override;
  void release_backward_scratch() override;

  // Query rows per causal block of the score products (Note [Causal blocks] in attention_kernels.h).
  static constexpr int64_t kCausalBlock = 64;

  // Heads (of the B*H) per pass of the products and softmax kernels: 0 (the default) lets the
  // device choose (all on the GPU, one on the CPU); a test sets it to run the GPU's all-heads
  // batched path on the CPU.
  void set_heads_per_pass(int64_t heads) { forced_heads_per_pass_ = heads; }

 private:
  int64_t heads_per_pass(int64_t heads_total) const;
  // The CPU's path: Note [Attention in the rows layout] (model/attention.cpp).
  bool rows_layout() const { return device_.is_cpu() && forced_heads_per_pass_ == 0; }

  int64_t embd_, heads_, head_size_, context_;
  Device device_;
  Linear c_attn_, c_proj_;
  int64_t batch_ = 0, time_ = 0;  // of the last forward
  int64_t forced_heads_per_pass_ = 0;
  // Kept from forward for backward: q|k|v as heads (3, B*H, T, hs), or c_attn's output (B*T, 3C) in
  // the rows layout, and the probabilities (B*H, T, T).
  Tensor qkv_heads_, qkv_, att_;
  Tensor y_heads_, y_rows_;  // att v (B*H, T, hs) and as rows (B*T, C); the rows layout writes y_rows_ alone
  // Backward's, reused step after step; the rows layout uses dscores of one head (T, T) as datt_
  // and writes dq|dk|dv straight into dqkv_rows_.
  Tensor dy_heads_, datt_, dqkv_heads_, dqkv_rows_;
};

}  // namespace dtrain
