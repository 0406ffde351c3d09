// The GPT model: its plan (names, shapes, counts, the spec's checks), its blocks and its build.
#include "model/gpt.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "model/activation.h"
#include "model/attention.h"
#include "model/gpt_kernels.h"
#include "model/linear.h"

namespace dtrain {

namespace {

constexpr float kInitStd = 0.02f;  // GPT-2's

// GPT-2's scaled init of the projections that write into the residual stream.
float residual_proj_std(int64_t layers) { return kInitStd / std::sqrt(2.f * static_cast<float>(layers)); }

void validate(const GptSpec& s) {
  auto positive = [](int64_t v, const char* what) {
    if (v < 1) throw Error(fmt::format("gpt: {} must be at least 1, got {}", what, v), ErrorKind::kUsage);
  };
  positive(s.vocab, "the vocabulary (--vocab)");
  positive(s.context, "the context (--context)");
  positive(s.layers, "the layer count (--layers)");
  positive(s.heads, "the head count (--heads)");
  positive(s.embd, "the embedding width (--embd)");
  if (s.embd % s.heads != 0)
    throw Error(fmt::format("gpt: the embedding width {} (--embd) is not divisible by the head count {} (--heads)",
                            s.embd, s.heads),
                ErrorKind::kUsage);
  if (s.vocab > INT32_MAX)
    throw Error(fmt::format("gpt: the vocabulary {} exceeds int32 token ids (at most {})", s.vocab, INT32_MAX),
                ErrorKind::kUsage);
}

const GptSpec& validated(const GptSpec& s) {
  validate(s);
  return s;
}

// Sum of counts, throwing on overflow.
int64_t add_counts(int64_t a, int64_t b, const std::string& what) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) throw Error(fmt::format("gpt: {}: parameter count overflows 64 bits", what));
  return r;
}

LayerSize part(std::string layer, std::vector<ParameterShape> tensors) {
  LayerSize l{std::move(layer), 0, std::move(tensors)};
  for (const ParameterShape& t : l.tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n = checked_mul(n, d, t.name);
    l.parameters = add_counts(l.parameters, n, t.name);
  }
  return l;
}

// GPT-2's initialisation of the embeddings, then the blocks made and named, in Gpt's order of
// draws (Gpt and build_gpt_layers: the same weights).
void init_gpt(const GptSpec& spec, Device device, uint64_t seed, TokenEmbedding& embedding,
              std::vector<std::unique_ptr<GptBlock>>& blocks) {
  InitRng rng(seed);
  normal_init(embedding.wte().value, kInitStd, rng);
  normal_init(embedding.wpe().value, kInitStd, rng);
  prefix_names(embedding, "transformer");
  const float proj_std = residual_proj_std(spec.layers);
  for (int64_t i = 0; i < spec.layers; ++i) {
    blocks.push_back(std::make_unique<GptBlock>(spec.embd, spec.heads, spec.context, device, rng, proj_std));
    prefix_names(*blocks.back(), fmt::format("transformer.h.{}", i));
  }
}

}  // namespace

std::vector<LayerSize> plan_gpt(const GptSpec& s) {
  validate(s);
  const int64_t c = s.embd;
  std::vector<LayerSize> parts;
  parts.push_back(part(fmt::format("TokenEmbedding(vocab={}, context={}, embd={})", s.vocab, s.context, c),
                       {{"transformer.wte.weight", {s.vocab, c}}, {"transformer.wpe.weight", {s.context, c}}}));
  const int64_t c3 = checked_mul(3, c, "gpt embd"), c4 = checked_mul(4, c, "gpt embd");
  for (int64_t i = 0; i < s.layers; ++i) {
    const std::string h = fmt::format("transformer.h.{}.", i);
    parts.push_back(part(fmt::format("Block {} (embd={}, heads={})", i, c, s.heads),
                         {{h + "ln_1.weight", {c}},
                          {h + "ln_1.bias", {c}},
                          {h + "attn.c_attn.weight", {c3, c}},
                          {h + "attn.c_attn.bias", {c3}},
                          {h + "attn.c_proj.weight", {c, c}},
                          {h + "attn.c_proj.bias", {c}},
                          {h + "ln_2.weight", {c}},
                          {h + "ln_2.bias", {c}},
                          {h + "mlp.c_fc.weight", {c4, c}},
                          {h + "mlp.c_fc.bias", {c4}},
                          {h + "mlp.c_proj.weight", {c, c4}},
                          {h + "mlp.c_proj.bias", {c}}}));
  }
  parts.push_back(part(fmt::format("LayerNorm({}) ln_f", c), {{"transformer.ln_f.weight", {c}},
                                                              {"transformer.ln_f.bias", {c}}}));
  return parts;
}

int64_t gpt_parameter_count(const GptSpec& spec) {
  int64_t n = 0;
  for (const LayerSize& l : plan_gpt(spec)) n = add_counts(n, l.parameters, l.layer);
  return n;
}

std::vector<LayerSize> plan_gpt_layers(const GptSpec& spec) {
  std::vector<LayerSize> layers = plan_gpt(spec);
  LayerSize head = layers.back();  // ln_f, then the output layer's copy of wte
  layers.pop_back();
  head.layer = fmt::format("GptHead({}, the output layer tied to wte)", head.layer);
  head.tensors.push_back(layers.front().tensors.front());
  head.parameters = add_counts(head.parameters, checked_mul(spec.vocab, spec.embd, "wte"), "wte");
  layers.push_back(std::move(head));
  return layers;
}

// ---- GptBlock ----

GptBlock::GptBlock(int64_t embd, int64_t heads, int64_t context, Device device, InitRng& rng, float proj_std)
    : embd_(embd), ln_1_(embd, device), ln_2_(embd, device) {
  attn_ = std::make_unique<CausalSelfAttention>(embd, heads, context, device, rng, proj_std);
  c_fc_ = std::make_unique<Linear>(embd, 4 * embd, device, rng, NormalInit{kInitStd});
  c_proj_ = std::make_unique<Linear>(4 * embd, embd, device, rng, NormalInit{proj_std});
  gelu_ = std::make_unique<GELU>();
  prefix_names(ln_1_, "ln_1");
  prefix_names(*attn_, "attn");
  prefix_names(ln_2_, "ln_2");
  prefix_names(*c_fc_, "mlp.c_fc");
  prefix_names(*c_proj_, "mlp.c_proj");
}

GptBlock::~GptBlock() = default;

Tensor GptBlock::forward(const Tensor& x) {
  DTRAIN_CHECK(x.ndim() == 3 && x.dim(2) == embd_, "GPT block (embd {}) got input {}", embd_, shape_str(x.shape()));
  const Device dev = x.device();
  const int64_t rows = x.dim(0) * x.dim(1);
  ensure_tensor(x1_, x.shape(), dev);
  ensure_tensor(out_, x.shape(), dev);
  const Tensor h = attn_->forward(ln_1_.forward(x));  // x [B, T, C]
  launch(dev, x.numel(), kernels::AddTensors{x1_.data(), x.data(), h.data()});
  const Tensor f = c_fc_->forward(ln_2_.forward(x1_).view({rows, embd_}));  // [B*T, 4C]
  const Tensor m = c_proj_->forward(gelu_->forward(f));                  // [B*T, C]
  launch(dev, x.numel(), kernels::AddTensors{out_.data(), x1_.data(), m.data()});
  return out_;
}

Tensor GptBlock::backward(const Tensor& grad_output, bool need_input_grad) {
  const Shape shape = out_.shape();
  const int64_t rows = shape[0] * shape[1];
  DTRAIN_CHECK(grad_output.numel() == out_.numel(), "GPT block backward got {} for output {}",
               shape_str(grad_output.shape()), shape_str(shape));
  // MLP branch, then ln_2 whose input gradient also takes the residual path: dx1 = dy + ...
  const Tensor dg = c_proj_->backward(grad_output.view({rows, embd_}));
  const Tensor df = c_fc_->backward(gelu_->backward_in_place(dg));  // dg is dead after GELU
  const Tensor dx1 = ln_2_.backward_add(df.view(shape), grad_output);
  const Tensor da = attn_->backward(dx1);
  if (!need_input_grad) {  // still the parameters' gradients and hooks
    ln_1_.backward(da, false);
    return {};
  }
  return ln_1_.backward_add(da, dx1);
}

std::vector<Parameter*> GptBlock::parameters() {
  std::vector<Parameter*> out;
  for (Module* m : std::initializer_list<Module*>{&ln_1_, attn_.get(), &ln_2_, c_fc_.get(), c_proj_.get()})
    for (Parameter* p : m->parameters()) out.push_back(p);
  return out;
}

void GptBlock::set_training(bool training) {
  Module::set_training(training);
  for (Module* m : std::initializer_list<Module*>{&ln_1_, attn_.get(), &ln_2_, c_fc_.get(), gelu_.get(), c_proj_.get()})
    m->set_training(training);
}

void GptBlock::set_amp(AmpMode mode) {  // the GEMM layers: attention's and the MLP's
  attn_->set_amp(mode);
  c_fc_->set_amp(mode);
  c_proj_->set_amp(mode);
}

void GptBlock::set_grad_ready_hook(GradReadyHook hook) {
  for (Module* m : std::initializer_list<Module*>{&ln_1_, attn_.get(), &ln_2_, c_fc_.get(), gelu_.get(), c_proj_.get()})
    m->set_grad_ready_hook(hook);
  Module::set_grad_ready_hook(std::move(hook));
}

void GptBlock::release_backward_scratch() {
  for (Module* m : std::initializer_list<Module*>{&ln_1_, attn_.get(), &ln_2_, c_fc_.get(), gelu_.get(), c_proj_.get()})
    m->release_backward_scratch();
}

std::string GptBlock::describe() const {
  return fmt::format("Block({}, {}, {}, mlp({}, GELU, {}))", ln_1_.describe(), attn_->describe(), ln_2_.describe(),
                     c_fc_->describe(), c_proj_->describe());
}

// ---- Gpt ----

Gpt::Gpt(const GptSpec& spec, Device device, uint64_t seed)
    : spec_(validated(spec)), embedding_(spec.vocab, spec.context, spec.embd, device), ln_f_(spec.embd, device),
      head_(embedding_.wte()) {
  init_gpt(spec, device, seed, embedding_, blocks_);
  prefix_names(ln_f_, "transformer.ln_f");
}

Gpt::~Gpt() = default;

Tensor Gpt::forward(const Tensor& tokens) {
  Tensor x = embedding_.forward(tokens);  // [B, T, C]
  for (auto& block : blocks_) x = block->forward(x);
  x = ln_f_.forward(x);
  return head_.forward(x.view({x.dim(0) * x.dim(1), spec_.embd}));  // [B*T, V]
}

Tensor Gpt::backward(const Tensor& grad_logits, bool) {
  Tensor dx = head_.backward(grad_logits);  // wte's first part: Note [Tied embedding gradient]
  dx = ln_f_.backward(dx);
  for (size_t i = blocks_.size(); i-- > 0;) {
    dx = blocks_[i]->backward(dx);
    // Note [Backward scratch] (model/module.h). The CPU's only: a GPU allocator would see a free
    // and an allocation per block and step for no first-touch cost to save.
    if (dx.device().is_cpu()) blocks_[i]->release_backward_scratch();
  }
  embedding_.backward(dx);  // wpe, then wte's second part and its one hook
  return {};
}

std::vector<Parameter*> Gpt::parameters() {
  std::vector<Parameter*> out = embedding_.parameters();
  for (auto& block : blocks_)
    for (Parameter* p : block->parameters()) out.push_back(p);
  for (Parameter* p : ln_f_.parameters()) out.push_back(p);
  return out;
}

void Gpt::set_training(bool training) {
  Module::set_training(training);
  embedding_.set_training(training);
  for (auto& block : blocks_) block->set_training(training);
  ln_f_.set_training(training);
}

void Gpt::set_amp(AmpMode mode) {
  for (auto& block : blocks_) block->set_amp(mode);
  head_.set_amp(mode);
}

void Gpt::set_grad_ready_hook(GradReadyHook hook) {
  embedding_.set_grad_ready_hook(hook);
  for (auto& block : blocks_) block->set_grad_ready_hook(hook);
  ln_f_.set_grad_ready_hook(hook);
  Module::set_grad_ready_hook(std::move(hook));
}

std::string Gpt::describe() const {
  return fmt::format("Gpt(vocab={}, context={}, layers={}, heads={}, embd={})", spec_.vocab, spec_.context,
                     spec_.layers, spec_.heads, spec_.embd);
}

// ---- GptHead ----

GptHead::GptHead(const Tensor& wte, Device device)
    : ln_f_(wte.dim(1), device),
      wte_{kGptTiedParameter, Tensor::empty(wte.shape(), device), Tensor::zeros(wte.shape(), device)},
      head_(wte_) {
  wte_.value.copy_from(wte);
  prefix_names(ln_f_, "transformer.ln_f");
}

Tensor GptHead::forward(const Tensor& x) {
  DTRAIN_CHECK(x.ndim() == 3 && x.dim(2) == wte_.value.dim(1), "GptHead (embd {}) got input {}", wte_.value.dim(1),
               shape_str(x.shape()));
  in_shape_ = x.shape();
  const Tensor h = ln_f_.forward(x);
  return head_.forward(h.view({x.dim(0) * x.dim(1), x.dim(2)}));  // [B*T, V]
}

Tensor GptHead::backward(const Tensor& grad_logits, bool) {
  const Tensor dx = head_.backward(grad_logits);  // this copy's whole gradient: final here
  grad_ready(wte_);
  return ln_f_.backward(dx.view(in_shape_)).view(in_shape_);
}

std::vector<Parameter*> GptHead::parameters() {
  std::vector<Parameter*> out = ln_f_.parameters();
  out.push_back(&wte_);
  return out;
}

void GptHead::set_grad_ready_hook(GradReadyHook hook) {
  ln_f_.set_grad_ready_hook(hook);
  Module::set_grad_ready_hook(std::move(hook));
}

std::string GptHead::describe() const { return fmt::format("GptHead({}, tied output layer)", ln_f_.describe()); }

std::unique_ptr<Sequential> build_gpt_layers(const GptSpec& spec, Device device, uint64_t seed, size_t begin,
                                             size_t end) {
  validate(spec);
  const auto L = static_cast<size_t>(spec.layers);
  end = std::min(end, L + 2);
  DTRAIN_CHECK(begin < end, "GPT layers [{}, {}) of {}", begin, end, L + 2);
  // Note [Stage construction] (model/models.h): the draws are counter-based, so a layer built
  // alone skips the others' draws (a normal value takes two) and gets Gpt's values.
  const auto draws = [](int64_t values) { return 2 * static_cast<uint64_t>(values); };
  const int64_t c = spec.embd;
  InitRng rng(seed);
  std::vector<std::unique_ptr<Module>> layers;
  Tensor wte;  // the head's copy, when the head is built without the embedding
  if (begin == 0) {
    auto embedding = std::make_unique<TokenEmbedding>(spec.vocab, spec.context, c, device);
    normal_init(embedding->wte().value, kInitStd, rng);
    normal_init(embedding->wpe().value, kInitStd, rng);
    prefix_names(*embedding, "transformer");
    wte = embedding->wte().value;
    layers.push_back(std::move(embedding));
  } else if (end == L + 2) {
    wte = Tensor::empty({spec.vocab, c}, device);
    normal_init(wte, kInitStd, rng);
    rng.skip(draws(spec.context * c));
  } else {
    rng.skip(draws(spec.vocab * c + spec.context * c));
  }
  const float proj_std = residual_proj_std(spec.layers);
  for (size_t i = 0; i < L; ++i) {
    if (i + 1 < begin || i + 1 >= end) {
      rng.skip(draws(12 * c * c));  // c_attn 3C x C, attn.c_proj C x C, c_fc 4C x C, mlp.c_proj C x 4C
      continue;
    }
    auto block = std::make_unique<GptBlock>(c, spec.heads, spec.context, device, rng, proj_std);
    prefix_names(*block, fmt::format("transformer.h.{}", i));
    layers.push_back(std::move(block));
  }
  if (end == L + 2) layers.push_back(std::make_unique<GptHead>(wte, device));
  return Sequential::of_named_layers(std::move(layers));
}

std::unique_ptr<Gpt> build_gpt(const GptSpec& spec, Device device, uint64_t seed, int64_t memory_budget_bytes, int ranks,
                               int zero_stage) {
  check_model_fits("gpt", plan_gpt(spec), memory_budget_bytes, ranks, zero_stage);
  return std::make_unique<Gpt>(spec, device, seed);
}

}  // namespace dtrain
