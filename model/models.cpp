#include "model/models.h"

#include "core/error.h"
#include "core/named_enum.h"
#include "model/activation.h"
#include "model/conv.h"
#include "model/linear.h"

namespace dtrain {

static std::unique_ptr<Sequential> build_mlp(const ModelSpec& spec, const Shape& sample_shape, int num_classes,
                                             Device device, InitRng& rng, uint64_t seed) {
  auto model = std::make_unique<Sequential>();
  model->emplace<Flatten>();
  int64_t width = shape_numel(sample_shape);
  for (size_t i = 0; i < spec.hidden.size(); ++i) {
    DTRAIN_CHECK(spec.hidden[i] > 0, "MLP hidden width {} is not positive", spec.hidden[i]);
    model->emplace<Linear>(width, spec.hidden[i], device, rng);
    model->emplace<ReLU>();
    if (spec.dropout > 0.f) model->emplace<Dropout>(spec.dropout, seed + 1000 + i);
    width = spec.hidden[i];
  }
  model->emplace<Linear>(width, num_classes, device, rng);
  return model;
}

static std::unique_ptr<Sequential> build_cnn(const ModelSpec& spec, const Shape& sample_shape, int num_classes,
                                             Device device, InitRng& rng, uint64_t seed) {
  DTRAIN_CHECK(sample_shape.size() == 3 && sample_shape[1] == 28 && sample_shape[2] == 28,
               "cnn expects 28x28 images, got {}", shape_str(sample_shape));
  auto model = std::make_unique<Sequential>();
  model->emplace<Conv2d>(sample_shape[0], 6, 5, 1, 2, device, rng);  // 6 x 28 x 28
  model->emplace<ReLU>();
  model->emplace<MaxPool2d>(2);                                      // 6 x 14 x 14
  model->emplace<Conv2d>(6, 16, 5, 1, 0, device, rng);               // 16 x 10 x 10
  model->emplace<ReLU>();
  model->emplace<MaxPool2d>(2);                                      // 16 x 5 x 5
  model->emplace<Flatten>();
  model->emplace<Linear>(16 * 5 * 5, 120, device, rng);
  model->emplace<ReLU>();
  if (spec.dropout > 0.f) model->emplace<Dropout>(spec.dropout, seed + 1000);
  model->emplace<Linear>(120, 84, device, rng);
  model->emplace<ReLU>();
  model->emplace<Linear>(84, num_classes, device, rng);
  return model;
}

namespace {
constexpr auto kModelKinds = enum_names<ModelKind>(std::pair{ModelKind::kMlp, "mlp"}, std::pair{ModelKind::kCnn, "cnn"});
}  // namespace

const char* model_kind_name(ModelKind kind) { return kModelKinds.name(kind); }
std::optional<ModelKind> parse_model_kind(const std::string& name) { return kModelKinds.parse(name); }

std::unique_ptr<Sequential> build_model(const ModelSpec& spec, const Shape& sample_shape, int num_classes,
                                        Device device, uint64_t seed) {
  InitRng rng(seed);
  switch (spec.kind) {
    case ModelKind::kMlp: return build_mlp(spec, sample_shape, num_classes, device, rng, seed);
    case ModelKind::kCnn: return build_cnn(spec, sample_shape, num_classes, device, rng, seed);
  }
  throw Error(fmt::format("unknown model kind {}", static_cast<int>(spec.kind)));
}

}  // namespace dtrain
