// PLACEHOLDER until branch i21-attn lands model/attention.h: a stand-in with the contract's
// constructor, parameters (c_attn.weight [3C, C], c_attn.bias, c_proj.weight [C, C],
// c_proj.bias) and shapes, but NO attention: y = c_proj(q + k + v), each position on its own.
// It lets the GPT block, its names, init, hooks and gradient checks be built and tested; it is
// removed by the merge of i21-attn (gpt.cpp then includes model/attention.h). CPU only: its two
// small kernels are not registered for CUDA.
#pragma once

#include <fmt/format.h>

#include "core/error.h"
#include "core/launch.h"
#include "model/init.h"
#include "model/linear.h"

namespace dtrain {

namespace kernels {
struct PlaceholderSumThirds {  // s[n, c] = qkv[n, c] + qkv[n, C + c] + qkv[n, 2C + c]
  float* s;
  const float* qkv;
  int64_t cols;
  DTRAIN_HD void operator()(int64_t i) const {
    const int64_t n = i / cols, c = i % cols;
    const float* r = qkv + n * 3 * cols;
    s[i] = r[c] + r[cols + c] + r[2 * cols + c];
  }
};
struct PlaceholderSpreadThirds {  // dqkv[n, j*C + c] = ds[n, c]
  float* dqkv;
  const float* ds;
  int64_t cols;
  DTRAIN_HD void operator()(int64_t i) const {
    const int64_t n = i / (3 * cols), c = i % cols;
    dqkv[i] = ds[n * cols + c];
  }
};
}  // namespace kernels

class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t embd, int64_t heads, int64_t context, Device device, InitRng& rng, float proj_std)
      : embd_(embd), heads_(heads), context_(context), c_attn_(embd, 3 * embd, device, rng),
        c_proj_(embd, embd, device, rng) {
    DTRAIN_CHECK(heads > 0 && embd % heads == 0, "attention: embd {} not divisible by heads {}", embd, heads);
    auto p = c_attn_.parameters();
    normal_init(p[0]->value, 0.02f, rng);
    p[1]->value.zero_();
    p[0]->name = "c_attn.weight";
    p[1]->name = "c_attn.bias";
    auto q = c_proj_.parameters();
    normal_init(q[0]->value, proj_std, rng);
    q[1]->value.zero_();
    q[0]->name = "c_proj.weight";
    q[1]->name = "c_proj.bias";
  }
  Tensor forward(const Tensor& x) override {
    const int64_t b = x.dim(0), t = x.dim(1), n = b * t;
    Tensor qkv = c_attn_.forward(x.view({n, embd_}));
    ensure_tensor(sum_, {n, embd_}, x.device());
    launch(x.device(), sum_.numel(), kernels::PlaceholderSumThirds{sum_.data(), qkv.data(), embd_});
    return c_proj_.forward(sum_).view({b, t, embd_});
  }
  Tensor backward(const Tensor& grad_output, bool need_input_grad = true) override {
    const Shape shape = grad_output.shape();
    const int64_t n = grad_output.numel() / embd_;
    Tensor ds = c_proj_.backward(grad_output.view({n, embd_}));
    ensure_tensor(spread_, {n, 3 * embd_}, grad_output.device());
    launch(grad_output.device(), spread_.numel(), kernels::PlaceholderSpreadThirds{spread_.data(), ds.data(), embd_});
    Tensor dx = c_attn_.backward(spread_, need_input_grad);
    return need_input_grad ? dx.view(shape) : Tensor{};
  }
  std::vector<Parameter*> parameters() override {
    auto p = c_attn_.parameters();
    for (Parameter* q : c_proj_.parameters()) p.push_back(q);
    return p;
  }
  void set_amp(AmpMode mode) override {
    c_attn_.set_amp(mode);
    c_proj_.set_amp(mode);
  }
  void set_grad_ready_hook(GradReadyHook hook) override {
    c_attn_.set_grad_ready_hook(hook);
    c_proj_.set_grad_ready_hook(hook);
    Module::set_grad_ready_hook(std::move(hook));
  }
  std::string describe() const override {
    return fmt::format("PlaceholderAttention(embd={}, heads={}, context={})", embd_, heads_, context_);
  }

 private:
  int64_t embd_, heads_, context_;
  Linear c_attn_, c_proj_;
  Tensor sum_, spread_;
};

}  // namespace dtrain
