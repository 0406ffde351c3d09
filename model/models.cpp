// The built-in models: their layer plan (sizes computed from the sample shape, and the memory
// check that runs before anything is allocated) and their construction.
#include "model/models.h"

#include <algorithm>
#include <type_traits>

#include "core/error.h"
#include "core/memory.h"
#include "core/named_enum.h"
#include "model/activation.h"
#include "model/conv.h"
#include "model/linear.h"
#include "model/resnet.h"

namespace dtrain {

namespace {

// The cnn's layers, as the plan and the builder both need them.
constexpr int64_t kConv1Out = 6, kConv2Out = 16, kKernel = 5, kPool = 2, kFc1 = 120, kFc2 = 84;

// Output length of a convolution or pooling window over n inputs; 0 when the window does not fit.
int64_t window_output(int64_t n, int64_t kernel, int64_t stride, int64_t pad) {
  return n + 2 * pad < kernel ? 0 : (n + 2 * pad - kernel) / stride + 1;
}

// Inputs to the cnn's first Linear layer for images of `sample_shape` (the flattened 16 x h x w
// after conv 5 pad 2, pool 2, conv 5, pool 2); throws when the image is too small or not 3-d.
int64_t cnn_flat_features(const Shape& sample_shape) {
  if (sample_shape.size() != 3 || sample_shape[0] < 1)
    throw Error(fmt::format("cnn expects samples of shape [channels, height, width], got {}", shape_str(sample_shape)),
                ErrorKind::kUsage);
  int64_t hw[2] = {sample_shape[1], sample_shape[2]};
  for (int64_t& n : hw) {
    n = window_output(n, kKernel, 1, 2);
    n = window_output(n, kPool, kPool, 0);
    n = window_output(n, kKernel, 1, 0);
    n = window_output(n, kPool, kPool, 0);
  }
  if (hw[0] < 1 || hw[1] < 1)
    throw Error(fmt::format("cnn needs images of at least 12x12 (two 5x5 convolutions, each followed by 2x2 max "
                            "pooling), got {}",
                            shape_str(sample_shape)),
                ErrorKind::kUsage);
  return checked_mul(kConv2Out, checked_mul(hw[0], hw[1], "cnn features"), "cnn features");
}

// A layer of `weights` x `per_weight` weights and `bias` biases, its count checked.
LayerSize layer_size(std::string name, int64_t weights, int64_t per_weight, int64_t bias) {
  int64_t count = checked_mul(weights, per_weight, name);
  if (__builtin_add_overflow(count, bias, &count)) throw Error(fmt::format("{}: parameter count overflows", name));
  return {std::move(name), count, {}};
}

// The layer at position `index` of the Sequential: its weight and bias as Linear and Conv2d shape them.
LayerSize with_tensors(LayerSize l, size_t index, Shape weight, int64_t bias) {
  l.tensors = {{fmt::format("{}.weight", index), std::move(weight)}, {fmt::format("{}.bias", index), {bias}}};
  l.index = index;
  return l;
}

LayerSize linear_size(int64_t in, int64_t out, size_t index) {
  return with_tensors(layer_size(fmt::format("Linear({}, {})", in, out), in, out, out), index, {out, in}, out);
}

LayerSize conv_size(int64_t in_c, int64_t out_c, size_t index) {
  return with_tensors(layer_size(fmt::format("Conv2d({}, {}, kernel={})", in_c, out_c, kKernel), in_c,
                                 out_c * kKernel * kKernel, out_c),
                      index, {out_c, in_c, kKernel, kKernel}, out_c);
}

// Refuses a model whose training state would exceed `budget` bytes, naming its largest layer.
// Bytes per parameter on one rank: the value, its gradient, and kTrainingBytesPerParameter's one
// optimizer state, of which ZeRO keeps 1/ranks.
double bytes_per_parameter(int ranks, int zero_stage) {
  const double state = kTrainingBytesPerParameter - 8;
  return 8 + (zero_stage > 0 ? state / ranks : state);
}

// The fewest pipeline stages (consecutive layers) whose training state each fits `budget` bytes
// at `per_parameter` bytes a parameter; 0 when a layer alone does not fit. Greedy: filling each
// stage as far as it goes needs no more stages than any other cut.
int stages_to_fit(const std::vector<LayerSize>& layers, double per_parameter, int64_t budget) {
  int stages = 1;
  double stage = 0;
  for (const LayerSize& l : layers) {
    const double bytes = static_cast<double>(l.parameters) * per_parameter;
    if (bytes > static_cast<double>(budget)) return 0;
    if (stage + bytes > static_cast<double>(budget)) {
      ++stages;
      stage = 0;
    }
    stage += bytes;
  }
  return stages;
}

// `pipeline_stages`: the stages the model is cut into; 0 for a model the pipeline cannot cut (no
// hint about stages then).
void check_fits(const std::string& model, const std::vector<LayerSize>& layers, int64_t budget, bool machine, int ranks,
                int zero_stage, int pipeline_stages = 0) {
  int64_t total = 0;
  const LayerSize* largest = &layers.front();
  for (const LayerSize& l : layers) {
    if (__builtin_add_overflow(total, l.parameters, &total))
      throw Error(fmt::format("{}: parameter count overflows 64 bits at {}", model, l.layer));
    if (l.parameters > largest->parameters) largest = &l;
  }
  const double per_parameter = bytes_per_parameter(ranks, zero_stage);
  const double bytes = static_cast<double>(total) * per_parameter;
  if (bytes <= static_cast<double>(budget)) return;
  std::string sharding;
  if (ranks > 1 && zero_stage == 0) {
    const double sharded = static_cast<double>(total) * bytes_per_parameter(ranks, 1);
    sharding = fmt::format("; with its optimizer state sharded over the {} ranks (ZeRO-1 or 2) it would need {} per rank{}",
                           ranks, format_bytes(sharded), sharded <= static_cast<double>(budget) ? ", which fits" : "");
  } else if (zero_stage > 0) {
    sharding = fmt::format(" (per rank, its optimizer state already sharded over {} ranks by ZeRO-{}; parameters and "
                           "gradients stay whole)",
                           ranks, zero_stage);
  }
  if (pipeline_stages == 1 && layers.size() > 1) {
    // Note [Stage construction]: a pipeline stage holds only its layers' state.
    const int stages = stages_to_fit(layers, per_parameter, budget);
    sharding += stages > 1 ? fmt::format("; cut into {} pipeline stages (--pipeline-stages {}, a rank per stage) each "
                                         "stage would fit",
                                         stages, stages)
                           : "; no cut into pipeline stages fits (its largest layer alone does not)";
  }
  const std::string limit = machine ? fmt::format("this machine's {} of memory", format_bytes(double(budget)))
                                    : fmt::format("its memory budget of {}", format_bytes(double(budget)));
  throw Error(fmt::format("{} needs {} to train ({} parameters with their gradients and optimizer state), more than "
                          "{}; its largest layer is {} with {} parameters ({}){}",
                          model, format_bytes(bytes), total, limit, largest->layer, largest->parameters,
                          format_bytes(static_cast<double>(largest->parameters) * per_parameter), sharding),
              ErrorKind::kResources);
}

// Builds the layers of a Sequential in order, only those in `range` (Note [Stage construction]):
// a layer outside it is not constructed, and its initialisation's draws (one per parameter, as
// the plan counts them) are skipped.
class LayerBuilder {
 public:
  LayerBuilder(LayerRange range, const std::vector<LayerSize>& plan, InitRng& rng) : range_(range), rng_(rng) {
    for (const LayerSize& l : plan) {
      if (draws_.size() <= l.index) draws_.resize(l.index + 1, 0);
      draws_[l.index] = l.parameters;
    }
  }
  template <class M, class... Args>
  void emplace(Args&&... args) {
    if constexpr (std::is_same_v<M, Dropout>) dropout_places_.push_back(index_);
    if (range_.contains(index_))
      model_->add(std::to_string(index_), std::make_unique<M>(std::forward<Args>(args)...));
    else if (index_ < draws_.size())
      rng_.skip(static_cast<uint64_t>(draws_[index_]));
    ++index_;
  }
  std::unique_ptr<Sequential> take() { return std::move(model_); }
  const std::vector<size_t>& dropout_places() const { return dropout_places_; }

 private:
  LayerRange range_;
  InitRng& rng_;
  std::vector<int64_t> draws_;  // by place in the Sequential
  size_t index_ = 0;
  std::vector<size_t> dropout_places_;  // the places of the Dropout layers met, built or not
  std::unique_ptr<Sequential> model_ = std::make_unique<Sequential>();
};

std::unique_ptr<Sequential> build_mlp(const ModelSpec& spec, const Shape& sample_shape, int num_classes,
                                      Device device, InitRng& rng, uint64_t seed, LayerBuilder& model) {
  model.emplace<Flatten>();
  int64_t width = shape_numel(sample_shape);
  for (size_t i = 0; i < spec.hidden.size(); ++i) {
    DTRAIN_CHECK(spec.hidden[i] > 0, "MLP hidden width {} is not positive", spec.hidden[i]);
    model.emplace<Linear>(width, spec.hidden[i], device, rng);
    model.emplace<ReLU>();
    if (spec.dropout > 0.f) model.emplace<Dropout>(spec.dropout, seed + 1000 + i);
    width = spec.hidden[i];
  }
  model.emplace<Linear>(width, num_classes, device, rng);
  return model.take();
}

std::unique_ptr<Sequential> build_cnn(const ModelSpec& spec, const Shape& sample_shape, int num_classes,
                                      Device device, InitRng& rng, uint64_t seed, LayerBuilder& model) {
  const int64_t flat = cnn_flat_features(sample_shape);
  model.emplace<Conv2d>(sample_shape[0], kConv1Out, kKernel, 1, 2, device, rng);  // 6 x H x W
  model.emplace<ReLU>();
  model.emplace<MaxPool2d>(kPool);                                               // 6 x H/2 x W/2
  model.emplace<Conv2d>(kConv1Out, kConv2Out, kKernel, 1, 0, device, rng);       // 16 x (H/2-4) x (W/2-4)
  model.emplace<ReLU>();
  model.emplace<MaxPool2d>(kPool);                                               // 16 x 5 x 5 for 28 x 28
  model.emplace<Flatten>();
  model.emplace<Linear>(flat, kFc1, device, rng);
  model.emplace<ReLU>();
  if (spec.dropout > 0.f) model.emplace<Dropout>(spec.dropout, seed + 1000);
  model.emplace<Linear>(kFc1, kFc2, device, rng);
  model.emplace<ReLU>();
  model.emplace<Linear>(kFc2, num_classes, device, rng);
  return model.take();
}

constexpr auto kModelKinds = enum_names<ModelKind>(std::pair{ModelKind::kMlp, "mlp"}, std::pair{ModelKind::kCnn, "cnn"},
                                                   std::pair{ModelKind::kResnet18, "resnet18"});

}  // namespace

const char* model_kind_name(ModelKind kind) { return kModelKinds.name(kind); }
std::optional<ModelKind> parse_model_kind(const std::string& name) { return kModelKinds.parse(name); }

std::vector<LayerSize> plan_model(const ModelSpec& spec, const Shape& sample_shape, int num_classes) {
  if (num_classes < 1)
    throw Error(fmt::format("{} needs at least one class, got {}", model_kind_name(spec.kind), num_classes),
                ErrorKind::kUsage);
  // The indices are the layers' places in the Sequential that build_mlp and build_cnn make
  // (activations, pooling and dropout included): they name the parameters.
  const size_t dropout = spec.dropout > 0.f ? 1 : 0;
  if (spec.kind == ModelKind::kResnet18) return plan_resnet18(spec.width, sample_shape, num_classes);
  std::vector<LayerSize> layers;
  if (spec.kind == ModelKind::kCnn) {
    const int64_t flat = cnn_flat_features(sample_shape);
    layers = {conv_size(sample_shape[0], kConv1Out, 0), conv_size(kConv1Out, kConv2Out, 3), linear_size(flat, kFc1, 7),
              linear_size(kFc1, kFc2, 9 + dropout), linear_size(kFc2, num_classes, 11 + dropout)};
    return layers;
  }
  int64_t width = shape_numel(sample_shape);
  size_t index = 1;  // after Flatten
  for (int64_t h : spec.hidden) {
    DTRAIN_CHECK(h > 0, "MLP hidden width {} is not positive", h);
    layers.push_back(linear_size(width, h, index));
    index += 2 + dropout;  // Linear, ReLU[, Dropout]
    width = h;
  }
  layers.push_back(linear_size(width, num_classes, index));
  return layers;
}

void check_model_fits(const std::string& model, const std::vector<LayerSize>& layers, int64_t memory_budget_bytes,
                      int ranks, int zero_stage) {
  const bool machine = memory_budget_bytes <= 0;
  check_fits(model, layers, machine ? host_memory_bytes() : memory_budget_bytes, machine, ranks, zero_stage);
}

std::vector<int64_t> layer_parameter_counts(const ModelSpec& spec, const Shape& sample_shape, int num_classes) {
  // resnet18: its top-level children (a residual stage layerN whole, Note [ResNet pipeline stages]).
  const std::vector<LayerSize> plan = plan_model(spec, sample_shape, num_classes);
  std::vector<int64_t> out(plan.back().index + 1, 0);  // the last layer is a Linear
  for (const LayerSize& l : plan) out[l.index] += l.parameters;
  return out;
}

std::vector<size_t> dropout_layer_places(const ModelSpec& spec, const Shape& sample_shape, int num_classes) {
  if (spec.kind == ModelKind::kResnet18) return {};
  // The builders themselves, over an empty range: nothing is constructed, so the places are
  // those build_model gives.
  const std::vector<LayerSize> plan = plan_model(spec, sample_shape, num_classes);
  InitRng rng(0);
  LayerBuilder builder(LayerRange{0, 0}, plan, rng);
  if (spec.kind == ModelKind::kMlp) build_mlp(spec, sample_shape, num_classes, Device::cpu(), rng, 0, builder);
  else build_cnn(spec, sample_shape, num_classes, Device::cpu(), rng, 0, builder);
  return builder.dropout_places();
}

std::unique_ptr<Sequential> build_model(const ModelSpec& spec, const Shape& sample_shape, int num_classes,
                                        Device device, uint64_t seed, LayerRange layers) {
  const bool machine = spec.memory_budget_bytes <= 0;
  std::vector<LayerSize> plan = plan_model(spec, sample_shape, num_classes);
  std::string name = model_kind_name(spec.kind);
  std::vector<LayerSize> mine;
  if (!layers.whole()) {
    for (const LayerSize& l : plan)
      if (layers.contains(l.index)) mine.push_back(l);
    name += fmt::format(" stage (layers {}-{})", layers.begin, layers.end - 1);
  }
  // A stage without parameters (a cut after the last Linear's ReLU) needs nothing checked.
  if (layers.whole() || !mine.empty())
    check_fits(name, layers.whole() ? plan : mine, machine ? host_memory_bytes() : spec.memory_budget_bytes, machine,
               spec.ranks, spec.zero_stage, spec.kind == ModelKind::kResnet18 ? 0 : spec.pipeline_stages);
  InitRng rng(seed);
  LayerBuilder builder(layers, plan, rng);
  switch (spec.kind) {
    case ModelKind::kMlp: return build_mlp(spec, sample_shape, num_classes, device, rng, seed, builder);
    case ModelKind::kCnn: return build_cnn(spec, sample_shape, num_classes, device, rng, seed, builder);
    case ModelKind::kResnet18:  // Note [ResNet pipeline stages]
      return build_resnet18(spec.width, sample_shape, num_classes, device, rng, layers.begin, layers.end);
  }
  throw Error(fmt::format("unknown model kind {}", static_cast<int>(spec.kind)));
}

}  // namespace dtrain
