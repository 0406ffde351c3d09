#include "model/attention.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "core/ops.h"
#include "model/attention_kernels.h"
#include "model/cpu_kernels.h"

namespace dtrain {

namespace {

// Calls f(begin, end) for each causal block of rows [begin, end) of [0, time).
template <class F>
void for_each_block(int64_t time, F&& f) {
  for (int64_t begin = 0; begin < time; begin += CausalSelfAttention::kCausalBlock)
    f(begin, std::min(time, begin + CausalSelfAttention::kCausalBlock));
}

}  // namespace

CausalSelfAttention::CausalSelfAttention(int64_t embd, int64_t heads, int64_t context, Device device, InitRng& rng,
                                         float proj_std)
    : embd_(embd),
      heads_(heads),
      head_size_(heads > 0 ? embd / heads : 0),
      context_(context),
      device_(device),
      // Draws in member order: c_attn's weight, then c_proj's (GPT-2's init, NormalInit).
      c_attn_(embd > 0 ? embd : 1, embd > 0 ? checked_mul(3, embd, "c_attn width") : 1, device, rng,
              NormalInit{0.02f}),
      c_proj_(embd > 0 ? embd : 1, embd > 0 ? embd : 1, device, rng, NormalInit{proj_std}) {
  DTRAIN_CHECK(embd > 0 && heads > 0 && context > 0,
               "CausalSelfAttention(embd {}, heads {}, context {}): sizes must be positive", embd, heads, context);
  DTRAIN_CHECK(embd % heads == 0, "CausalSelfAttention: embd {} is not a multiple of heads {}", embd, heads);
  prefix_names(c_attn_, "c_attn");
  prefix_names(c_proj_, "c_proj");
}

// Heads per pass of the products and softmax kernels: on the GPU all of them in each call (a few
// large launches); on the CPU one head at a time, so that a head's T x T probabilities stay in
// cache from the scores' product through the softmax to att v, and through the five steps of
// backward (256 KiB at T = 256, 4 MiB at 1024, where all heads together are 8 MiB and 200 MiB).
// Measured at B=8 T=256 C=256 H=4 (1 thread, thread CPU time, loaded machine): 53.7-57.3 ms
// one head at a time, 54.3-63.5 ms all 32 at once; the larger T it is meant for is unmeasured.
//
// Note [Attention in the rows layout]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The GPU's path copies q|k|v out of c_attn's rows (B*T, 3C) into heads (3, B*H, T, hs), so that
// one strided-batched product serves all heads, and copies y and dq|dk|dv back. The CPU runs one
// head at a time anyway, and a BLAS product takes any row stride: head (b, h)'s q is the (T, hs)
// block at row b*T, column h*hs of c_attn's output, row stride 3C (k at column C + h*hs, v at
// 2C + h*hs), its y the block at column h*hs of y_rows_ (stride C), its dy likewise in c_proj's
// input gradient, and its dq|dk|dv land in dqkv_rows_ at q|k|v's columns. So the CPU keeps
// c_attn's output instead of a copy, makes no re-layout pass (four per step per layer), and needs
// dscores of one head, not of all: 12 fewer (B*T, C)-sized buffers per layer (24 MiB at the
// issue's shape, and fewer pages for the first step to fault in). The products and the softmax
// are the same calls on the same numbers (the library packs its operands whatever their stride):
// the same bits as the heads layout (AllHeadsBatchedPathMatchesOneHeadPerPass checks).
int64_t CausalSelfAttention::heads_per_pass(int64_t heads_total) const {
  if (forced_heads_per_pass_ > 0) return std::min(forced_heads_per_pass_, heads_total);
  return device_.is_cpu() ? 1 : heads_total;
}

Tensor CausalSelfAttention::forward(const Tensor& input) {
  DTRAIN_CHECK(input.ndim() == 3 && input.dim(2) == embd_ && input.dim(1) >= 1 && input.dim(1) <= context_,
               "{} got input {} (want [B, T <= {}, {}])", describe(), shape_str(input.shape()), context_, embd_);
  const int64_t B = input.dim(0), T = input.dim(1), C = embd_, H = heads_, hs = head_size_, BH = B * H;
  batch_ = B;
  time_ = T;
  const Device dev = device_;
  const Tensor qkv = c_attn_.forward(input.view({B * T, C}));  // (B*T, 3C)
  const float scale = 1.f / std::sqrt(static_cast<float>(hs));
  ensure_tensor(att_, {BH, T, T}, dev);
  ensure_tensor(y_rows_, {B * T, C}, dev);
  if (rows_layout()) {  // Note [Attention in the rows layout]
    qkv_ = qkv;
    const int64_t ld = 3 * C;
    for (int64_t bh = 0; bh < BH; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const float* q = qkv.data() + b * T * ld + h * hs;  // (T, hs), row stride 3C
      const float* k = q + C;
      const float* v = k + C;
      float* att = att_.data() + bh * T * T;  // (T, T)
      float* y = y_rows_.data() + b * T * C + h * hs;  // (T, hs), row stride C
      for_each_block(T, [&](int64_t r0, int64_t r1) {
        gemm_batched(dev, false, true, r1 - r0, r1, hs, scale, q + r0 * ld, ld, k, ld, 0.f, att + r0 * T, T, {});
      });
      cpu::causal_softmax_forward(att, T, T, kCausalBlock);  // Note [CPU softmax]
      for_each_block(T, [&](int64_t r0, int64_t r1) {
        gemm_batched(dev, false, false, r1 - r0, hs, r1, 1.f, att + r0 * T, T, v, ld, 0.f, y + r0 * C, C, {});
      });
    }
    return c_proj_.forward(y_rows_).view({B, T, C});
  }
  ensure_tensor(qkv_heads_, {3, BH, T, hs}, dev);
  launch_rows(dev, 3 * BH * T, kernels::RowsToHeads{qkv_heads_.data(), qkv.data(), B, T, H, hs, 3});
  ensure_tensor(y_heads_, {BH, T, hs}, dev);
  const int64_t group = heads_per_pass(BH);
  for (int64_t g0 = 0; g0 < BH; g0 += group) {
    const int64_t n = std::min(group, BH - g0);
    const float* q = qkv_heads_.data() + g0 * T * hs;  // heads [g0, g0 + n): (n, T, hs)
    const float* k = q + BH * T * hs;
    const float* v = k + BH * T * hs;
    float* att = att_.data() + g0 * T * T;  // (n, T, T)
    float* y = y_heads_.data() + g0 * T * hs;
    // att = softmax(q k^T / sqrt(hs)), masked, block by block (Note [Causal blocks]).
    const GemmBatch heads_qk{n, T * hs, T * hs, T * T};
    for_each_block(T, [&](int64_t r0, int64_t r1) {
      gemm_batched(dev, false, true, r1 - r0, r1, hs, scale, q + r0 * hs, hs, k, hs, 0.f, att + r0 * T, T, heads_qk);
    });
    if (dev.is_cpu())  // the rows layout's floats (Note [CPU softmax])
      cpu::causal_softmax_forward(att, n * T, T, kCausalBlock);
    else
      launch_rows(dev, n * T, kernels::CausalSoftmaxForward{att, T, kCausalBlock});
    // y = att v: rows of a block read the keys up to the block's end.
    const GemmBatch heads_av{n, T * T, T * hs, T * hs};
    for_each_block(T, [&](int64_t r0, int64_t r1) {
      gemm_batched(dev, false, false, r1 - r0, hs, r1, 1.f, att + r0 * T, T, v, hs, 0.f, y + r0 * hs, hs, heads_av);
    });
  }
  launch_rows(dev, BH * T, kernels::HeadsToRows{y_rows_.data(), y_heads_.data(), B, T, H, hs, 1});
  return c_proj_.forward(y_rows_).view({B, T, C});
}

Tensor CausalSelfAttention::backward(const Tensor& grad_output, bool need_input_grad) {
  const int64_t B = batch_, T = time_, C = embd_, H = heads_, hs = head_size_, BH = B * H;
  DTRAIN_CHECK(att_.defined() && grad_output.numel() == B * T * C, "{} backward got {} after a forward of [{}, {}, {}]",
               describe(), shape_str(grad_output.shape()), B, T, C);
  const Device dev = device_;
  const Tensor dy_rows = c_proj_.backward(grad_output.view({B * T, C}), true);  // fires c_proj's hooks
  const float scale = 1.f / std::sqrt(static_cast<float>(hs));
  ensure_tensor(dqkv_rows_, {B * T, 3 * C}, dev);
  if (rows_layout()) {  // Note [Attention in the rows layout]: the steps below, one head at a time
    const int64_t ld = 3 * C;
    ensure_tensor(datt_, {T, T}, dev);  // one head's dscores at a time
    float* ds = datt_.data();
    for (int64_t bh = 0; bh < BH; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const float* dy = dy_rows.data() + b * T * C + h * hs;  // (T, hs), row stride C
      const float* q = qkv_.data() + b * T * ld + h * hs;     // (T, hs), row stride 3C
      const float* k = q + C;
      const float* v = k + C;
      const float* att = att_.data() + bh * T * T;
      float* dq = dqkv_rows_.data() + b * T * ld + h * hs;
      float* dk = dq + C;
      float* dv = dk + C;
      for_each_block(T, [&](int64_t c0, int64_t c1) {
        gemm_batched(dev, true, false, c1 - c0, hs, T - c0, 1.f, att + c0 * T + c0, T, dy + c0 * C, C, 0.f,
                     dv + c0 * ld, ld, {});
      });
      for_each_block(T, [&](int64_t r0, int64_t r1) {
        gemm_batched(dev, false, true, r1 - r0, r1, hs, 1.f, dy + r0 * C, C, v, ld, 0.f, ds + r0 * T, T, {});
      });
      cpu::causal_softmax_backward(ds, att, T, T, kCausalBlock);  // Note [Interleaved sums]
      for_each_block(T, [&](int64_t r0, int64_t r1) {
        gemm_batched(dev, false, false, r1 - r0, hs, r1, scale, ds + r0 * T, T, k, ld, 0.f, dq + r0 * ld, ld, {});
      });
      for_each_block(T, [&](int64_t c0, int64_t c1) {
        gemm_batched(dev, true, false, c1 - c0, hs, T - c0, scale, ds + c0 * T + c0, T, q + c0 * ld, ld, 0.f,
                     dk + c0 * ld, ld, {});
      });
    }
    const Tensor dx = c_attn_.backward(dqkv_rows_, need_input_grad);  // fires c_attn's hooks
    return dx.defined() ? dx.view({B, T, C}) : Tensor{};
  }
  ensure_tensor(dy_heads_, {BH, T, hs}, dev);
  launch_rows(dev, BH * T, kernels::RowsToHeads{dy_heads_.data(), dy_rows.data(), B, T, H, hs, 1});
  ensure_tensor(dqkv_heads_, {3, BH, T, hs}, dev);
  ensure_tensor(datt_, {BH, T, T}, dev);
  const int64_t group = heads_per_pass(BH);
  for (int64_t g0 = 0; g0 < BH; g0 += group) {
    const int64_t n = std::min(group, BH - g0);
    const float* dy = dy_heads_.data() + g0 * T * hs;  // heads [g0, g0 + n)
    const float* q = qkv_heads_.data() + g0 * T * hs;
    const float* k = q + BH * T * hs;
    const float* v = k + BH * T * hs;
    const float* att = att_.data() + g0 * T * T;
    float* ds = datt_.data() + g0 * T * T;
    float* dq = dqkv_heads_.data() + g0 * T * hs;
    float* dk = dq + BH * T * hs;
    float* dv = dk + BH * T * hs;
    const GemmBatch rows_by_keys{n, T * T, T * hs, T * hs};  // (T, T) per head times (T, hs) per head
    const GemmBatch rows_by_rows{n, T * hs, T * hs, T * T};  // (T, hs) times (T, hs)^T
    // dv = att^T dy: keys of block [c0, c1) are read by queries t >= c0 only.
    for_each_block(T, [&](int64_t c0, int64_t c1) {
      gemm_batched(dev, true, false, c1 - c0, hs, T - c0, 1.f, att + c0 * T + c0, T, dy + c0 * hs, hs, 0.f,
                   dv + c0 * hs, hs, rows_by_keys);
    });
    // datt = dy v^T on the lower block triangle, then dscores = softmax backward, in place.
    for_each_block(T, [&](int64_t r0, int64_t r1) {
      gemm_batched(dev, false, true, r1 - r0, r1, hs, 1.f, dy + r0 * hs, hs, v, hs, 0.f, ds + r0 * T, T,
                   rows_by_rows);
    });
    if (dev.is_cpu())  // the rows layout's floats
      cpu::causal_softmax_backward(ds, att, n * T, T, kCausalBlock);
    else
      launch_rows(dev, n * T, kernels::CausalSoftmaxBackward{ds, att, T, kCausalBlock});
    // scores = scale q k^T: dq = scale ds k, dk = scale ds^T q.
    for_each_block(T, [&](int64_t r0, int64_t r1) {
      gemm_batched(dev, false, false, r1 - r0, hs, r1, scale, ds + r0 * T, T, k, hs, 0.f, dq + r0 * hs, hs,
                   rows_by_keys);
    });
    for_each_block(T, [&](int64_t c0, int64_t c1) {
      gemm_batched(dev, true, false, c1 - c0, hs, T - c0, scale, ds + c0 * T + c0, T, q + c0 * hs, hs, 0.f,
                   dk + c0 * hs, hs, rows_by_keys);
    });
  }
  launch_rows(dev, 3 * BH * T, kernels::HeadsToRows{dqkv_rows_.data(), dqkv_heads_.data(), B, T, H, hs, 3});
  const Tensor dx = c_attn_.backward(dqkv_rows_, need_input_grad);  // fires c_attn's hooks
  return dx.defined() ? dx.view({B, T, C}) : Tensor{};
}

std::vector<Parameter*> CausalSelfAttention::parameters() {
  std::vector<Parameter*> out = c_attn_.parameters();
  for (Parameter* p : c_proj_.parameters()) out.push_back(p);
  return out;
}

std::string CausalSelfAttention::describe() const {
  return fmt::format("CausalSelfAttention(embd={}, heads={}, context={})", embd_, heads_, context_);
}

void CausalSelfAttention::release_backward_scratch() {
  for (Tensor* t : {&dy_heads_, &datt_, &dqkv_heads_, &dqkv_rows_}) *t = {};
  c_attn_.release_backward_scratch();
  c_proj_.release_backward_scratch();
}

void CausalSelfAttention::set_amp(AmpMode mode) {
  c_attn_.set_amp(mode);
  c_proj_.set_amp(mode);
}

void CausalSelfAttention::set_grad_ready_hook(GradReadyHook hook) {
  c_attn_.set_grad_ready_hook(hook);
  c_proj_.set_grad_ready_hook(hook);
  Module::set_grad_ready_hook(std::move(hook));
}

}  // namespace dtrain
