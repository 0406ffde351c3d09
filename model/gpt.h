// The GPT-2-style language model (nanoGPT's layout): token + position embedding, `layers`
// pre-LayerNorm blocks (ln_1, causal self-attention, residual; ln_2, MLP C -> 4C -> C with
// tanh-GELU, residual), a final LayerNorm and an output layer tied to the token embedding.
// forward takes token ids I32 [B, T] (T <= context) and returns logits F32 [B*T, V] for
// CrossEntropyLoss. Parameter names are nanoGPT's ("transformer.h.0.attn.c_attn.weight"),
// Linear weights [out, in] as PyTorch's, and lm_head.weight is not stored (it is wte): the
// tensors load into ../shared/peers/torch_gpt_peer.py with strict=True once lm_head is re-tied.
// Initialisation as GPT-2: normal(0, 0.02) for every weight and embedding, zero biases,
// LayerNorm 1 / 0, the residual projections (attn.c_proj, mlp.c_proj) normal(0, 0.02/sqrt(2L)).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "model/embedding.h"
#include "model/layernorm.h"
#include "model/models.h"
#include "model/sequential.h"

namespace dtrain {

struct GptSpec {
  int64_t vocab = 0, context = 256, layers = 4, heads = 4, embd = 256;
};

// The model's parameterised parts in forward order (the embeddings, each block, ln_f) with
// their tensors named and shaped as build_gpt makes them; computed, nothing allocated. Throws
// dtrain::Error (one line) for a bad spec: a size below 1, embd not divisible by heads, a
// vocabulary beyond int32 token ids, or a count that overflows.
std::vector<LayerSize> plan_gpt(const GptSpec& spec);
int64_t gpt_parameter_count(const GptSpec& spec);  // sum over plan_gpt (wte counted once)

class CausalSelfAttention;
class GELU;
class Linear;

// One pre-LayerNorm block, x [B, T, C] -> [B, T, C]: x1 = x + attn(ln_1(x)); y = x1 +
// mlp(ln_2(x1)). Parameters (local names) ln_1.*, attn.c_attn.*, attn.c_proj.*, ln_2.*,
// mlp.c_fc.*, mlp.c_proj.*. backward fires each parameter's hook as its gradient is final,
// in reverse parameter order; the residual gradients are summed inside the LayerNorm
// backward passes (LayerNorm::backward_add), not in passes of their own.
class GptBlock : public Module {
 public:
  GptBlock(int64_t embd, int64_t heads, int64_t context, Device device, InitRng& rng, float proj_std);
  ~GptBlock() override;
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& grad_output, bool need_input_grad = true) override;
  std::vector<Parameter*> parameters() override;
  void set_training(bool training) override;
  void set_amp(AmpMode mode) override;
  void set_grad_ready_hook(GradReadyHook hook) override;
  void release_backward_scratch() override;
  std::string describe() const override;

 private:
  int64_t embd_;
  LayerNorm ln_1_, ln_2_;
  std::unique_ptr<CausalSelfAttention> attn_;
  std::unique_ptr<Linear> c_fc_, c_proj_;
  std::unique_ptr<GELU> gelu_;
  Tensor x1_, out_;
};

// Note [GPT pipeline stages]: for pipeline parallelism (pipeline/) the GPT is a Sequential of
// L + 2 layers cut at their boundaries: layer 0 the embeddings (wte, wpe), layers 1..L the
// blocks, layer L + 1 a GptHead (ln_f and the output layer). The output layer is tied to wte:
// GptHead holds its own copy, named transformer.wte.weight too, equal at the start, so the first
// and last stages each hold one (Megatron's and DeepSpeed's answer); the pipeline adds the two
// copies' gradients before each optimizer step (PipelineOptions::tied_parameter), so both take
// the same update. Same initial weights, same arithmetic per layer as Gpt.
class GptHead : public Module {
 public:
  GptHead(const Tensor& wte, Device device);  // copies wte [V, C]
  Tensor forward(const Tensor& x) override;   // F32 [B, T, C] -> logits [B*T, V]
  Tensor backward(const Tensor& grad_logits, bool need_input_grad = true) override;  // -> [B, T, C]
  std::vector<Parameter*> parameters() override;  // ln_f.weight, ln_f.bias, wte (the copy)
  void set_amp(AmpMode mode) override { head_.set_amp(mode); }
  void set_grad_ready_hook(GradReadyHook hook) override;
  std::string describe() const override;

 private:
  LayerNorm ln_f_;
  Parameter wte_;
  TiedLmHead head_;
  Shape in_shape_;
};

// The layers of Note [GPT pipeline stages] with their sizes (the head counts its wte copy):
// computed, nothing allocated, for the cut and the per-stage memory check.
std::vector<LayerSize> plan_gpt_layers(const GptSpec& spec);
// The GPT's layers [begin, end) of those (a pipeline stage's; the default: all), parameters
// named as Gpt's, with Gpt's initial weights from `seed`; the other layers are not built.
std::unique_ptr<Sequential> build_gpt_layers(const GptSpec& spec, Device device, uint64_t seed, size_t begin = 0,
                                             size_t end = SIZE_MAX);
// The name of the parameter the first and the last layer share.
inline constexpr const char* kGptTiedParameter = "transformer.wte.weight";

class Gpt : public Module {
 public:
  Gpt(const GptSpec& spec, Device device, uint64_t seed);
  ~Gpt() override;
  Tensor forward(const Tensor& tokens) override;  // I32 [B, T] -> logits F32 [B*T, V]
  // Takes dlogits [B*T, V]; tokens have no gradient, so it returns an undefined Tensor.
  Tensor backward(const Tensor& grad_logits, bool need_input_grad = false) override;
  std::vector<Parameter*> parameters() override;
  void set_training(bool training) override;
  void set_amp(AmpMode mode) override;
  void set_grad_ready_hook(GradReadyHook hook) override;
  std::string describe() const override;
  const GptSpec& spec() const { return spec_; }
  GptBlock& block(size_t i) { return *blocks_.at(i); }

 private:
  GptSpec spec_;
  TokenEmbedding embedding_;
  std::vector<std::unique_ptr<GptBlock>> blocks_;
  LayerNorm ln_f_;
  TiedLmHead head_;
};

// plan_gpt, then the memory check of model/models.h (check_model_fits; memory_budget_bytes <=
// 0: this machine's memory), then the model with GPT-2's initialisation drawn from `seed`.
// `ranks` and `zero_stage` as ModelSpec's (model/models.h).
std::unique_ptr<Gpt> build_gpt(const GptSpec& spec, Device device, uint64_t seed, int64_t memory_budget_bytes = 0,
                               int ranks = 1, int zero_stage = 0);

}  // namespace dtrain
