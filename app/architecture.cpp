#include "app/architecture.h"

#include <charconv>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain {

namespace {

constexpr const char* kModel = "dtrain.model";
constexpr const char* kHidden = "dtrain.hidden";
constexpr const char* kWidth = "dtrain.width";  // resnet18
constexpr const char* kDropout = "dtrain.dropout";
constexpr const char* kInput = "dtrain.input_shape";
constexpr const char* kClasses = "dtrain.classes";
constexpr const char* kNormalize = "dtrain.normalize";
constexpr const char* kLayers = "dtrain.layers";
constexpr const char* kHeads = "dtrain.heads";
constexpr const char* kEmbd = "dtrain.embd";
constexpr const char* kContext = "dtrain.context";
constexpr const char* kVocab = "dtrain.vocab";

// Floats as the shortest text that reads back to the same float.
std::string float_text(float v) { return fmt::format("{}", v); }

[[noreturn]] void bad(const std::string& source, const char* key, const std::string& value, const char* expected) {
  throw Error(fmt::format("{}: __metadata__ {}: expected {}, got '{}'", source, key, expected, value));
}

std::vector<int64_t> parse_ints(const std::string& source, const char* key, const std::string& text) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (true) {
    const size_t end = std::min(text.find(',', start), text.size());
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(text.data() + start, text.data() + end, v);
    if (ec != std::errc() || ptr != text.data() + end || v <= 0) bad(source, key, text, "positive whole numbers, comma separated");
    out.push_back(v);
    if (end == text.size()) return out;
    start = end + 1;
  }
}

float parse_float(const std::string& source, const char* key, const std::string& text) {
  char* end = nullptr;
  const float v = std::strtof(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v)) bad(source, key, text, "a number");
  return v;
}

const std::string& require_key(const safetensors::Metadata& m, const std::string& source, const char* key) {
  auto it = m.find(key);
  if (it == m.end()) throw Error(fmt::format("{}: __metadata__ has {} but no {}", source, kModel, key));
  return it->second;
}

}  // namespace

safetensors::Metadata architecture_metadata(const Architecture& a) {
  safetensors::Metadata m = {
      {"format", "pt"},
      {kModel, model_kind_name(a.model.kind)},
      {kDropout, float_text(a.model.dropout)},
      {kInput, fmt::format("{}", fmt::join(a.input_shape, ","))},
      {kClasses, std::to_string(a.classes)},
      {kNormalize, float_text(a.normalize.mean) + "," + float_text(a.normalize.std)},
  };
  if (a.model.kind == ModelKind::kMlp) m[kHidden] = fmt::format("{}", fmt::join(a.model.hidden, ","));
  if (a.model.kind == ModelKind::kResnet18) m[kWidth] = std::to_string(a.model.width);
  return m;
}

std::optional<Architecture> architecture_from_metadata(const safetensors::Metadata& m, const std::string& source) {
  auto kind_it = m.find(kModel);
  if (kind_it == m.end()) return std::nullopt;
  Architecture a;
  if (kind_it->second == "gpt")
    throw Error(fmt::format("{}: a GPT's weights (__metadata__ dtrain.model gpt): this command takes mlp or cnn", source));
  auto kind = parse_model_kind(kind_it->second);
  if (!kind) bad(source, kModel, kind_it->second, "mlp, cnn or resnet18");
  a.model.kind = *kind;
  if (a.model.kind == ModelKind::kMlp) a.model.hidden = parse_ints(source, kHidden, require_key(m, source, kHidden));
  if (a.model.kind == ModelKind::kResnet18) {
    const std::vector<int64_t> w = parse_ints(source, kWidth, require_key(m, source, kWidth));
    if (w.size() != 1 || w[0] > 4096) bad(source, kWidth, require_key(m, source, kWidth), "a width up to 4096");
    a.model.width = w[0];
  }
  a.model.dropout = parse_float(source, kDropout, require_key(m, source, kDropout));
  if (a.model.dropout < 0.f || a.model.dropout >= 1.f) bad(source, kDropout, require_key(m, source, kDropout), "a probability in [0, 1)");
  a.input_shape = parse_ints(source, kInput, require_key(m, source, kInput));
  const std::vector<int64_t> classes = parse_ints(source, kClasses, require_key(m, source, kClasses));
  if (classes.size() != 1 || classes[0] > 1'000'000) bad(source, kClasses, require_key(m, source, kClasses), "a class count");
  a.classes = static_cast<int>(classes[0]);
  const std::string& norm = require_key(m, source, kNormalize);
  const size_t comma = norm.find(',');
  if (comma == std::string::npos) bad(source, kNormalize, norm, "MEAN,STD");
  a.normalize.mean = parse_float(source, kNormalize, norm.substr(0, comma));
  a.normalize.std = parse_float(source, kNormalize, norm.substr(comma + 1));
  if (a.normalize.std <= 0.f) bad(source, kNormalize, norm, "MEAN,STD with STD > 0");
  return a;
}

void check_weights_fit(const safetensors::File& weights, const Architecture& arch) {
  for (const LayerSize& layer : plan_model(arch.model, arch.input_shape, arch.classes))
    for (const ParameterShape& t : layer.tensors) {
      const safetensors::TensorInfo* info = weights.find(t.name);
      if (!info)
        throw Error(fmt::format("{}: no tensor '{}', which the architecture ({}) needs with shape {}", weights.source(),
                                t.name, describe(arch), shape_str(t.shape)));
      if (info->shape != t.shape)
        throw Error(fmt::format("{}: tensor '{}' has shape {}, but the architecture ({}) needs {}", weights.source(),
                                t.name, shape_str(info->shape), describe(arch), shape_str(t.shape)));
    }
}

safetensors::Metadata gpt_architecture_metadata(const GptSpec& spec) {
  return {{"format", "pt"},
          {kModel, "gpt"},
          {kLayers, std::to_string(spec.layers)},
          {kHeads, std::to_string(spec.heads)},
          {kEmbd, std::to_string(spec.embd)},
          {kContext, std::to_string(spec.context)},
          {kVocab, std::to_string(spec.vocab)}};
}

std::optional<GptSpec> gpt_spec_from_metadata(const safetensors::Metadata& m, const std::string& source) {
  auto kind = m.find(kModel);
  if (kind == m.end() || kind->second != "gpt") return std::nullopt;
  auto one = [&](const char* key) {
    const std::string& text = require_key(m, source, key);
    const std::vector<int64_t> v = parse_ints(source, key, text);
    if (v.size() != 1 || v[0] > (int64_t{1} << 20)) bad(source, key, text, "a positive whole number up to 1048576");
    return v[0];
  };
  GptSpec spec;
  spec.layers = one(kLayers);
  spec.heads = one(kHeads);
  spec.embd = one(kEmbd);
  spec.context = one(kContext);
  spec.vocab = one(kVocab);
  if (spec.embd % spec.heads != 0) bad(source, kHeads, require_key(m, source, kHeads), "a divisor of dtrain.embd");
  return spec;
}

void check_gpt_weights_fit(const safetensors::File& weights, const GptSpec& spec) {
  int64_t stored = 0;
  for (const safetensors::TensorInfo& info : weights.header().tensors) stored += shape_numel(info.shape);
  const int64_t needed = gpt_parameter_count(spec);
  if (stored != needed)
    throw Error(fmt::format("{}: the metadata's GPT (L{} H{} C{} T{} V{}) has {} parameters, the file holds {}",
                            weights.source(), spec.layers, spec.heads, spec.embd, spec.context, spec.vocab, needed,
                            stored));
}

void load_parameters(const safetensors::File& weights, Module& model) {
  std::vector<safetensors::NamedTarget> targets;
  for (const NamedTensor& t : state_tensors(model)) targets.push_back({*t.name, t.value});  // buffers too
  safetensors::load_named(weights, targets);
}

std::string describe(const Architecture& a) {
  if (a.model.kind == ModelKind::kCnn) return "cnn";
  if (a.model.kind == ModelKind::kResnet18) return fmt::format("resnet18 width {}", a.model.width);
  return fmt::format("mlp {}-{}-{}", shape_numel(a.input_shape), fmt::join(a.model.hidden, "-"), a.classes);
}

}  // namespace dtrain
