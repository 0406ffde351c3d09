#include "model/embedding.h"

#include <utility>

#include <fmt/format.h>

#include "core/error.h"
#include "core/kernels.h"
#include "core/ops.h"
#include "model/gpt_kernels.h"

namespace dtrain {

TokenEmbedding::TokenEmbedding(int64_t vocab, int64_t context, int64_t channels, Device device)
    : vocab_(vocab), context_(context), channels_(channels) {
  DTRAIN_CHECK(vocab > 0 && context > 0 && channels > 0, "TokenEmbedding(vocab {}, context {}, channels {}): sizes must be positive",
               vocab, context, channels);
  DTRAIN_CHECK(vocab <= INT32_MAX, "TokenEmbedding: vocabulary {} exceeds int32 token ids", vocab);
  wte_ = {"wte.weight", Tensor::zeros({vocab, channels}, device), Tensor::zeros({vocab, channels}, device)};
  wpe_ = {"wpe.weight", Tensor::zeros({context, channels}, device), Tensor::zeros({context, channels}, device)};
}

Tensor TokenEmbedding::forward(const Tensor& tokens) {
  DTRAIN_CHECK(tokens.dtype() == DType::kI32 && tokens.ndim() == 2 && tokens.dim(1) >= 1 && tokens.dim(1) <= context_,
               "TokenEmbedding (context {}) expects int32 tokens [B, T] with 1 <= T <= {}, got {} {}", context_,
               context_, dtype_name(tokens.dtype()), shape_str(tokens.shape()));
  const Device dev = wte_.value.device();
  const int64_t batch = tokens.dim(0), seq = tokens.dim(1);
  tokens_ = tokens;
  ensure_tensor(output_, {batch, seq, channels_}, dev);
  launch(dev, output_.numel(),
         kernels::EmbeddingForward{output_.data(), tokens.data_as<int32_t>(), wte_.value.data(), wpe_.value.data(),
                                   seq, channels_, vocab_});
  return output_;
}

Tensor TokenEmbedding::backward(const Tensor& grad_output, bool) {
  const Device dev = wte_.value.device();
  const int64_t batch = tokens_.dim(0), seq = tokens_.dim(1), positions = batch * seq;
  DTRAIN_CHECK(grad_output.numel() == positions * channels_, "TokenEmbedding backward got {}",
               shape_str(grad_output.shape()));
  // wpe first (reverse parameter order); wte last: Note [Tied embedding gradient].
  launch(dev, context_ * channels_,
         kernels::PositionBackward{wpe_.grad.data(), grad_output.data(), batch, seq, channels_, take_grad_beta(wpe_)});
  grad_ready(wpe_);
  // The positions sorted by (token, position), then where each token's run begins: Note [Token buckets].
  ensure_tensor(buckets_, {vocab_ + 1 + 2 * positions}, dev, DType::kI32);
  int32_t* offsets = buckets_.data_as<int32_t>();
  int32_t* order = offsets + vocab_ + 1;
  int32_t* scratch = order + positions;
  const int32_t* tokens = tokens_.data_as<int32_t>();
  launch(dev, positions, kernels::IotaI32{order});  // runs of width 1, sorted
  for (int64_t width = 1; width < positions; width *= 2) {
    launch(dev, positions, kernels::MergeByToken{scratch, order, tokens, positions, width, vocab_});
    std::swap(order, scratch);
  }
  launch(dev, vocab_ + 1, kernels::TokenOffsets{offsets, order, tokens, positions, vocab_});
  launch(dev, vocab_ * channels_,
         kernels::EmbeddingBackward{wte_.grad.data(), grad_output.data(), offsets, order, channels_, take_grad_beta(wte_)});
  grad_ready(wte_);
  return {};
}

std::string TokenEmbedding::describe() const {
  return fmt::format("TokenEmbedding(vocab={}, context={}, embd={})", vocab_, context_, channels_);
}

// Note [Padded logits]: with GPT-2's vocabulary (50257, odd) as the row stride of the logits and
// of their gradient, cuBLAS has only its unaligned kernels for the head's three products: on an
// H100 they took 6.6 ms for the forward product at B*T = 8192, C = 768, bf16, about five times an
// aligned one. On a GPU the products therefore use rows padded to a multiple of 64 (llm.c pads its
// vocabulary to 50304 for the same reason), while the parameter keeps its [V, C] shape and names:
// the forward copies the logits into the compact [N, V] tensor the loss reads (one pass), the
// backward lays the incoming gradient out padded (packed to 16 bits when the amp packs anyway).
// The pad columns are never read: every product's inner or outer width is V. On the CPU the
// stride is V, so nothing is copied.
int64_t TiedLmHead::row_stride(int64_t vocab, Device device) {
  constexpr int64_t kAlign = 64;
  return device.is_cpu() ? vocab : (vocab + kAlign - 1) / kAlign * kAlign;
}

Tensor TiedLmHead::forward(const Tensor& x) {
  const Tensor& w = wte_.value;
  const int64_t vocab = w.dim(0), channels = w.dim(1);
  DTRAIN_CHECK(x.ndim() == 2 && x.dim(1) == channels, "TiedLmHead (embd {}) got input {}", channels,
               shape_str(x.shape()));
  const Device dev = w.device();
  const int64_t rows = x.dim(0), ld = row_stride(vocab, dev);
  input_ = x;
  ensure_tensor(logits_, {rows, vocab}, dev);
  if (ld != vocab) ensure_tensor(padded_, {rows, ld}, dev);  // Note [Padded logits]
  float* out = ld != vocab ? padded_.data() : logits_.data();
  half_ = amp_operand_dtype(amp_);
  if (half_ != DType::kF32) {
    pack_half(half_, x, input_half_);
    pack_half(half_, w, weight_half_);
    gemm_half_strided(dev, half_, false, true, rows, vocab, channels, 1.f, input_half_.data_as<uint16_t>(), channels,
                      weight_half_.data_as<uint16_t>(), channels, 0.f, out, ld);
  } else if (ld != vocab) {
    gemm_batched(dev, false, true, rows, vocab, channels, 1.f, x.data(), channels, w.data(), channels, 0.f, out, ld,
                 {});
  } else {
    gemm(dev, false, true, rows, vocab, channels, 1.f, x.data(), w.data(), 0.f, out);
  }
  if (ld != vocab) launch_rows(dev, rows, kernels::CopyRows{logits_.data(), out, vocab, vocab, ld});
  return logits_;
}

Tensor TiedLmHead::backward(const Tensor& dlogits) {
  const Tensor& w = wte_.value;
  const int64_t vocab = w.dim(0), channels = w.dim(1), rows = input_.dim(0);
  DTRAIN_CHECK(dlogits.numel() == rows * vocab, "TiedLmHead backward got {}", shape_str(dlogits.shape()));
  const Device dev = w.device();
  const int64_t ld = row_stride(vocab, dev);
  ensure_tensor(grad_input_, {rows, channels}, dev);
  // No grad_ready(wte) here: Note [Tied embedding gradient].
  if (half_ != DType::kF32) {
    if (ld != vocab) {  // Note [Padded logits]
      ensure_tensor(grad_half_, {rows, ld}, dev, half_);
      launch_rows(dev, rows,
                  kernels::PackRowsHalf{grad_half_.data_as<uint16_t>(), dlogits.data(), vocab, ld, half_ == DType::kF16});
    } else {
      pack_half(half_, dlogits, grad_half_);
    }
    const uint16_t* dy = grad_half_.data_as<uint16_t>();
    gemm_half_strided(dev, half_, true, false, vocab, channels, rows, 1.f, dy, ld, input_half_.data_as<uint16_t>(),
                      channels, take_grad_beta(wte_), wte_.grad.data(), channels);
    gemm_half_strided(dev, half_, false, false, rows, channels, vocab, 1.f, dy, ld, weight_half_.data_as<uint16_t>(),
                      channels, 0.f, grad_input_.data(), channels);
    return grad_input_;
  }
  if (ld != vocab) {  // Note [Padded logits]: the forward's padded buffer is free again
    ensure_tensor(padded_, {rows, ld}, dev);
    launch_rows(dev, rows, kernels::CopyRows{padded_.data(), dlogits.data(), vocab, ld, vocab});
    gemm_batched(dev, true, false, vocab, channels, rows, 1.f, padded_.data(), ld, input_.data(), channels,
                 take_grad_beta(wte_), wte_.grad.data(), channels, {});
    gemm_batched(dev, false, false, rows, channels, vocab, 1.f, padded_.data(), ld, w.data(), channels, 0.f,
                 grad_input_.data(), channels, {});
    return grad_input_;
  }
  gemm(dev, true, false, vocab, channels, rows, 1.f, dlogits.data(), input_.data(), take_grad_beta(wte_),
       wte_.grad.data());
  gemm(dev, false, false, rows, channels, vocab, 1.f, dlogits.data(), w.data(), 0.f, grad_input_.data());
  return grad_input_;
}

}  // namespace dtrain
