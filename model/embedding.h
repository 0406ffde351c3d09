// The GPT's input and output layers. TokenEmbedding: tokens I32 (B, T) -> wte[token] + wpe[t],
// F32 (B, T, C), with parameters "wte.weight" (V, C) and "wpe.weight" (context, C); its
// backward is a gather in token order (model/gpt_kernels.h Note [Token buckets]), the same bits on
// every thread count. TiedLmHead: logits (N, V) = x (N, C) wte^T, the output layer that shares
// the token embedding's weight (GPT-2's tying).
//
// Note [Tied embedding gradient]: wte gets two contributions per backward, the head's (which
// runs first) and the embedding's (which runs last). The head writes its part with
// take_grad_beta(wte) (overwrite after zero_grad, else accumulate) and does NOT call grad_ready;
// the embedding then accumulates (its take_grad_beta gives 1) and calls grad_ready(wte) once,
// the last hook of the backward, so DDP all-reduces the sum.
#pragma once

#include "model/amp.h"
#include "model/init.h"
#include "model/module.h"

namespace dtrain {

class TokenEmbedding : public Module {
 public:
  TokenEmbedding(int64_t vocab, int64_t context, int64_t channels, Device device);
  Tensor forward(const Tensor& tokens) override;  // tokens I32 (B, T), T <= context
  Tensor backward(const Tensor& grad_output, bool need_input_grad = false) override;  // returns {}
  std::vector<Parameter*> parameters() override { return {&wte_, &wpe_}; }
  std::string describe() const override;
  Parameter& wte() { return wte_; }
  Parameter& wpe() { return wpe_; }

 private:
  int64_t vocab_, context_, channels_;
  Parameter wte_, wpe_;
  Tensor tokens_, output_;
  Tensor buckets_;  // I32: offsets (V + 1), then two buffers of B*T positions (the sort ping-pongs)
};

// Not a Module: it owns no parameter (wte belongs to the TokenEmbedding). With AmpMode::kBf16 or
// kFp16 its GEMMs take 16-bit operands, as autocast does for lm_head.
class TiedLmHead {
 public:
  explicit TiedLmHead(Parameter& wte) : wte_(wte) {}
  Tensor forward(const Tensor& x);         // x (N, C) -> logits (N, V)
  Tensor backward(const Tensor& dlogits);  // accumulates dwte (no grad_ready), returns dx (N, C)
  void set_amp(AmpMode mode) { amp_ = mode; }
  // The row stride of the head's products: V on the CPU, V rounded up to 64 on a GPU (Note
  // [Padded logits] in embedding.cpp).
  static int64_t row_stride(int64_t vocab, Device device);

 private:
  Parameter& wte_;
  AmpMode amp_ = AmpMode::kOff;
  DType half_ = DType::kF32;  // the last forward's operand format
  Tensor input_, logits_, grad_input_;
  // Note [Padded logits] (GPU): [N, Vp] logits, then the fp32 gradient; [Vp, C] weight operand
  // (fp32; weight_half_ holds the packed one) and weight gradient.
  Tensor padded_, weight_padded_, weight_grad_padded_;
  Tensor input_half_, weight_half_, grad_half_;
};

}  // namespace dtrain
