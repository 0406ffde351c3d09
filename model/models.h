// The built-in models: `mlp` (Flatten, then Linear+ReLU per hidden width, then Linear to the
// classes; default 784-256-10, the seeds' model) and `cnn` (LeNet-5 style: two 5x5 convolutions,
// each followed by ReLU and 2x2 max pooling, then 120-84-classes; its first Linear layer is sized
// from the image it is given, 16x5x5 for 28x28) and `resnet18` (model/resnet.h: torchvision's
// ResNet-18 with the small-image stem and base width `width`, BatchNorm's buffers included).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/sequential.h"

namespace dtrain {

enum class ModelKind { kMlp, kCnn, kResnet18 };
const char* model_kind_name(ModelKind kind);                      // "mlp", "cnn", "resnet18"
std::optional<ModelKind> parse_model_kind(const std::string& name);  // the names above

struct ModelSpec {
  ModelKind kind = ModelKind::kMlp;
  std::vector<int64_t> hidden = {256};  // mlp only; every width positive
  float dropout = 0.f;                  // after each hidden activation, in [0, 1)
  int64_t width = 16;                   // resnet18 only: the first stage's channels (torchvision: 64)
  // The most memory the model's training state may take; 0: this machine's physical memory.
  // Ranks that share a machine should each pass their share.
  int64_t memory_budget_bytes = 0;
  // How the training state is spread over the job's ranks (ddp/zero_plan.h): ZeRO stage 1 or 2
  // keeps 1/ranks of the optimizer state per rank (the whole parameters and gradient buffer stay).
  int ranks = 1;
  int zero_stage = 0;
  // The pipeline stages the model is cut into (Note [Stage construction]): at 1, an mlp or cnn
  // that does not fit is refused saying how many stages would fit.
  int pipeline_stages = 1;
};

// Note [Stage construction]: a pipeline stage (Note [Pipeline partition] in
// pipeline/partition.h) is the layers [begin, end) of the Sequential build_model makes, and is
// built alone: the other layers are never allocated. Each built layer keeps its place's name
// ("3.weight") and the initial weights it has in the whole model: the initialisation's draws are
// counter-based (InitRng, model/init.h), so build_model skips the draws of the layers before
// `begin` (one per parameter: PyTorch's uniform init) instead of drawing them. A ReLU at a
// stage's start is not fused into the previous stage's layer (Note [Fused ReLU]: same floats).
struct LayerRange {
  size_t begin = 0, end = static_cast<size_t>(-1);  // the default: every layer
  bool contains(size_t i) const { return i >= begin && i < end; }
  bool whole() const { return begin == 0 && end == static_cast<size_t>(-1); }
};

// Training state per parameter: the weight, its gradient and one optimizer state (SGD momentum;
// AdamW keeps two, so the estimate is a floor).
inline constexpr int64_t kTrainingBytesPerParameter = 12;

// One parameter tensor as the built model names it ("1.weight", as Sequential::parameters()).
struct ParameterShape {
  std::string name;
  Shape shape;
};

// One buffer (Module::buffers(): BatchNorm's running statistics) as the built model names it.
struct BufferShape {
  std::string name;
  Shape shape;
  DType dtype = DType::kF32;
};

struct LayerSize {
  std::string layer;       // "Linear(784, 256)"
  int64_t parameters = 0;  // weights and bias
  std::vector<ParameterShape> tensors;  // its weight and bias, named and shaped as built
  size_t index = 0;                     // its place in the Sequential (mlp, cnn)
  std::vector<BufferShape> buffers = {};  // its buffers, named, shaped and typed as built
};

// The parameterised layers `spec` builds for samples of `sample_shape`, in order, with their
// parameter counts and tensors; computed, nothing allocated (a weights file can be checked
// against it before a model is built). Throws dtrain::Error (one line) when the sample
// shape does not suit the model (a cnn needs [channels, height, width] of at least 12x12), when
// num_classes < 1, or when a count overflows.
std::vector<LayerSize> plan_model(const ModelSpec& spec, const Shape& sample_shape, int num_classes);

// Refuses (dtrain::Error of kind kResources, one line naming `model`, its largest layer and the
// sizes) layers whose training state would not fit in memory_budget_bytes (<= 0: this machine's
// physical memory). build_model runs it; other model families (model/gpt.h) share it.
// With ranks > 1 the refusal also says what sharding the optimizer state (ZeRO) would need per
// rank, or that it is already sharded.
void check_model_fits(const std::string& model, const std::vector<LayerSize>& layers, int64_t memory_budget_bytes,
                      int ranks = 1, int zero_stage = 0);

// Every layer of the Sequential `spec` builds, its parameter count (0 for activations, pooling,
// dropout): what a pipeline's balanced cut weighs. Nothing allocated.
//
// Note [ResNet pipeline stages]: resnet18's layers are its top-level children, conv1, bn1,
// layer1..layer4 (each residual stage whole, its blocks and their skip connections inside one
// child), avgpool and fc: 8 places to cut. A stage of it builds only its children, names
// unchanged, as Note [Stage construction] says (the draws of the children before it skipped:
// a convolution's and fc's one per parameter, a BatchNorm's none), and keeps the chain of
// Note [Chained joins] across the cut; the memory check counts the stage's.
std::vector<int64_t> layer_parameter_counts(const ModelSpec& spec, const Shape& sample_shape, int num_classes);

// The places in the Sequential of the Dropout layers of the mlp or cnn `spec` builds, in order
// (none for resnet18 or without dropout); nothing allocated. The unsplit model's Dropout counters
// are listed in this order, so a pipeline stage's are those at its layers' places (Note
// [Pipeline dropout] in pipeline/pipeline_stage.h).
std::vector<size_t> dropout_layer_places(const ModelSpec& spec, const Shape& sample_shape, int num_classes);

// Builds the model after plan_model, refusing (dtrain::Error, one line naming the largest layer
// and the sizes) one whose training state would not fit in spec.memory_budget_bytes. With
// `layers`: only those layers, as Note [Stage construction] says, and the memory check counts
// only them.
std::unique_ptr<Sequential> build_model(const ModelSpec& spec, const Shape& sample_shape, int num_classes,
                                        Device device, uint64_t seed, LayerRange layers = {});

}  // namespace dtrain
