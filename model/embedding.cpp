#include "model/embedding.h"

#include <utility>

#include <fmt/format.h>

#include "core/error.h"
#include "core/kernels.h"
#include "core/memory.h"
#include "core/ops.h"
#include "model/cpu_kernels.h"
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
  if (dev.is_cpu()) {
    cpu::embedding_forward(tokens.data_as<int32_t>(), wte_.value.data(), wpe_.value.data(), batch * seq, seq,
                           channels_, vocab_, output_.data());
    return output_;
  }
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
  const float beta_wpe = take_grad_beta(wpe_);  // before reading wpe_.grad (module.h)
  launch(dev, context_ * channels_,
         kernels::PositionBackward{wpe_.grad.data(), grad_output.data(), batch, seq, channels_, beta_wpe});
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
  const float beta_wte = take_grad_beta(wte_);
  launch(dev, vocab_ * channels_,
         kernels::EmbeddingBackward{wte_.grad.data(), grad_output.data(), offsets, order, channels_, beta_wte});
  grad_ready(wte_);
  return {};
}

std::string TokenEmbedding::describe() const {
  return fmt::format("TokenEmbedding(vocab={}, context={}, embd={})", vocab_, context_, channels_);
}

// Note [Padded logits]: with GPT-2's vocabulary (50257, odd) as a width of the head's products,
// cuBLAS has only its unaligned kernels for them: on an H100 (bf16, B*T = 8192, C = 768) the
// forward product took 6.6 ms and the weight gradient's 4.8 ms, against 1.25 ms for the one
// product where V is the inner dimension. On a GPU the head therefore works at a width Vp, V
// rounded up to 64 (llm.c pads its vocabulary to 50304 for the same reason), while the parameter
// keeps its [V, C] shape and names:
// - forward: the weight operand is copied (packed, with amp) into [Vp, C] rows whose pad rows are
//   zero, the logits come out [N, Vp], and their first V columns are copied into the compact
//   [N, V] tensor the loss reads;
// - backward: the incoming gradient is laid out [N, Vp] with zero pad columns (packed to 16 bits
//   with amp, as it is anyway); the weight gradient is made [Vp, C] in a scratch and its first V
//   rows added into wte's gradient (the pad rows are dropped); dx's product runs over Vp too
//   (an odd inner width V also left cuBLAS unaligned: 4.9 ms), the pads adding 0 x 0.
// On the CPU Vp = V and nothing is copied.
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
  half_ = amp_operand_dtype(amp_);
  if (ld == vocab) {
    if (half_ != DType::kF32) {
      pack_half(half_, x, input_half_);
      pack_half(half_, w, weight_half_);
      gemm_half(dev, half_, false, true, rows, vocab, channels, 1.f, input_half_.data_as<uint16_t>(),
                weight_half_.data_as<uint16_t>(), 0.f, logits_.data());
    } else {
      gemm(dev, false, true, rows, vocab, channels, 1.f, x.data(), w.data(), 0.f, logits_.data());
    }
    return logits_;
  }
  // Note [Padded logits]
  ensure_tensor(padded_, {rows, ld}, dev);
  if (half_ != DType::kF32) {
    pack_half(half_, x, input_half_);
    ensure_tensor(weight_half_, {ld, channels}, dev, half_);
    uint16_t* wh = weight_half_.data_as<uint16_t>();
    launch_rows(dev, vocab, kernels::PackRowsHalf{wh, w.data(), channels, channels, half_ == DType::kF16});
    zero_bytes(wh + vocab * channels, dev, static_cast<size_t>((ld - vocab) * channels) * sizeof(uint16_t));
    gemm_half(dev, half_, false, true, rows, ld, channels, 1.f, input_half_.data_as<uint16_t>(), wh, 0.f,
              padded_.data());
  } else {
    ensure_tensor(weight_padded_, {ld, channels}, dev);
    copy_bytes(weight_padded_.data(), dev, w.data(), dev, static_cast<size_t>(vocab * channels) * sizeof(float));
    zero_bytes(weight_padded_.data() + vocab * channels, dev,
               static_cast<size_t>((ld - vocab) * channels) * sizeof(float));
    gemm(dev, false, true, rows, ld, channels, 1.f, x.data(), weight_padded_.data(), 0.f, padded_.data());
  }
  launch_rows(dev, rows, kernels::CopyRows{logits_.data(), padded_.data(), vocab, vocab, ld});
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
  const float beta = take_grad_beta(wte_);  // before reading wte_.grad (module.h)
  if (ld == vocab) {
    if (half_ != DType::kF32) {
      pack_half(half_, dlogits, grad_half_);
      const uint16_t* dy = grad_half_.data_as<uint16_t>();
      gemm_half(dev, half_, true, false, vocab, channels, rows, 1.f, dy, input_half_.data_as<uint16_t>(),
                beta, wte_.grad.data());
      gemm_half(dev, half_, false, false, rows, channels, vocab, 1.f, dy, weight_half_.data_as<uint16_t>(), 0.f,
                grad_input_.data());
    } else {
      gemm(dev, true, false, vocab, channels, rows, 1.f, dlogits.data(), input_.data(), beta,
           wte_.grad.data());
      gemm(dev, false, false, rows, channels, vocab, 1.f, dlogits.data(), w.data(), 0.f, grad_input_.data());
    }
    return grad_input_;
  }
  // Note [Padded logits]
  ensure_tensor(weight_grad_padded_, {ld, channels}, dev);
  if (half_ != DType::kF32) {
    ensure_tensor(grad_half_, {rows, ld}, dev, half_);
    uint16_t* dy = grad_half_.data_as<uint16_t>();
    launch_rows(dev, rows, kernels::PackRowsHalf{dy, dlogits.data(), vocab, ld, half_ == DType::kF16});
    gemm_half(dev, half_, true, false, ld, channels, rows, 1.f, dy, input_half_.data_as<uint16_t>(), 0.f,
              weight_grad_padded_.data());
    gemm_half(dev, half_, false, false, rows, channels, ld, 1.f, dy, weight_half_.data_as<uint16_t>(), 0.f,
              grad_input_.data());
  } else {
    ensure_tensor(padded_, {rows, ld}, dev);  // the forward's logits are no longer needed
    launch_rows(dev, rows, kernels::CopyRows{padded_.data(), dlogits.data(), vocab, ld, vocab});
    gemm(dev, true, false, ld, channels, rows, 1.f, padded_.data(), input_.data(), 0.f, weight_grad_padded_.data());
    gemm(dev, false, false, rows, channels, ld, 1.f, padded_.data(), weight_padded_.data(), 0.f, grad_input_.data());
  }
  launch(dev, vocab * channels,
         kernels::AccumulateInto{wte_.grad.data(), weight_grad_padded_.data(), beta});
  return grad_input_;
}

}  // namespace dtrain
