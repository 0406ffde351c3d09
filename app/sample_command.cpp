#include "app/sample_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include <fmt/format.h>

#include "app/architecture.h"
#include "app/train_options.h"
#include "core/command_line.h"
#include "core/error.h"
#include "model/kernels.h"
#include "train/checkpointer.h"
#include "train/root_broadcast.h"

namespace dtrain {

namespace {

constexpr int64_t kByteVocabulary = 256;

cxxopts::Options make_sample_options() {
  cxxopts::Options o("dtrain sample", "Text from a byte-level GPT (dtrain train --model gpt on byte shards).");
  // clang-format off
  o.add_options()
    ("weights", "FILE.safetensors, a checkpoint (DIR/step-N) or a checkpoint directory (its latest)", cxxopts::value<std::string>())
    ("prompt", "The text to continue (its bytes are the first tokens)", cxxopts::value<std::string>())
    ("tokens", "How many tokens (bytes) to generate", cxxopts::value<int64_t>())
    ("temperature", "Logits divided by it before the softmax; 0: always the most likely byte", cxxopts::value<float>()->default_value("1"))
    ("top-k", "Draw only among the K most likely bytes (0: all)", cxxopts::value<int64_t>()->default_value("0"))
    ("seed", "Seed of the draws: the same seed, the same text", cxxopts::value<uint64_t>()->default_value("0"))
    ("device", "auto, cpu, cuda or cuda:N", cxxopts::value<std::string>()->default_value("auto"))
    ("threads", "CPU BLAS threads per rank (0: cores / local ranks)", cxxopts::value<int>()->default_value("0"))
    ("h,help", "Show this help");
  // clang-format on
  return o;
}

// Position p's logits of a [n, V] tensor on any device, on the host.
std::vector<float> logits_row(const Tensor& logits, int64_t p) {
  const int64_t v = logits.dim(-1);
  return logits.slice(p * v, {v}).to_vector();
}

}  // namespace

ParsedSample parse_sample_options(const std::vector<std::string>& args) {
  cxxopts::Options options = make_sample_options();
  const ParsedFlags flags = parse_flags(options, args);
  ParsedSample out;
  if (flags.help) {
    out.help = true;
    out.help_text = flags.help_text;
    return out;
  }
  const cxxopts::ParseResult& r = flags.result;
  // The train flags' own rules check --device and --threads (no --data needed to sample).
  SampleConfig& c = out.config;
  c.runtime = parse_runtime_flags(r["device"].as<std::string>(), r["threads"].as<int>());
  if (!r.count("weights")) throw UsageError("--weights: required (FILE.safetensors or a checkpoint directory)");
  c.weights = r["weights"].as<std::string>();
  if (!r.count("prompt") || r["prompt"].as<std::string>().empty())
    throw UsageError("--prompt: required, at least one byte (its bytes are the first tokens)");
  c.prompt = r["prompt"].as<std::string>();
  if (!r.count("tokens")) throw UsageError("--tokens: required (how many bytes to generate)");
  c.tokens = r["tokens"].as<int64_t>();
  if (c.tokens <= 0) throw UsageError(fmt::format("--tokens: must be positive, got {}", c.tokens));
  c.sampling.temperature = r["temperature"].as<float>();
  if (!std::isfinite(c.sampling.temperature) || c.sampling.temperature < 0)
    throw UsageError(fmt::format("--temperature: must be finite and >= 0 (0: greedy), got {}", c.sampling.temperature));
  c.sampling.top_k = r["top-k"].as<int64_t>();
  if (c.sampling.top_k < 0) throw UsageError(fmt::format("--top-k: must be >= 0 (0: all), got {}", c.sampling.top_k));
  c.sampling.seed = r["seed"].as<uint64_t>();
  return out;
}

GptSpec sample_gpt_spec(const safetensors::Metadata& metadata, const std::string& source) {
  const std::optional<GptSpec> spec = gpt_spec_from_metadata(metadata, source);
  if (!spec) {
    const auto model = metadata.find("dtrain.model");
    throw Error(fmt::format("{}: not a GPT (__metadata__ dtrain.model is {}); sample needs weights written by "
                            "dtrain train --model gpt",
                            source, model == metadata.end() ? "absent" : "'" + model->second + "'"));
  }
  if (spec->vocab != kByteVocabulary)
    throw Error(fmt::format("{}: sample needs a byte-level model (vocabulary 256); this one has vocabulary {}", source,
                            spec->vocab));
  return *spec;
}

int32_t sample_token(std::span<const float> logits, const SamplingSettings& settings, uint64_t draw) {
  const auto vocab = static_cast<int64_t>(logits.size());
  if (vocab == 0) throw Error("sample: no logits to draw from");
  // Candidates by descending logit, the lower id first among equals: greedy is the first, top-k
  // the first k. A NaN would make the order meaningless, so it is refused below, not sorted.
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  for (float l : logits)
    if (std::isnan(l)) throw Error("sample: the model's logits hold a NaN");
  const bool all = settings.temperature > 0 && (settings.top_k == 0 || settings.top_k >= vocab);
  const int64_t keep = settings.temperature == 0 ? 1 : all ? vocab : settings.top_k;
  auto before = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), before);
  ids.resize(static_cast<size_t>(keep));
  const float top = logits[ids[0]];
  if (!std::isfinite(top)) throw Error(fmt::format("sample: the largest logit is {}", top));
  if (keep == 1) return ids[0];
  // softmax((l - top) / temperature) in double: the largest term is exactly 1, none overflows.
  std::vector<double> weight(ids.size());
  double total = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    weight[i] = std::exp((static_cast<double>(logits[ids[i]]) - top) / settings.temperature);
    total += weight[i];
  }
  const double u = static_cast<double>(kernels::uniform01(settings.seed, draw)) * total;
  double cumulative = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    cumulative += weight[i];
    if (u < cumulative) return ids[i];
  }
  return ids[0];  // u within rounding of total: the most likely, never a token of weight 0
}

std::vector<int32_t> run_sample(Runtime& rt, const SampleConfig& c) {
  auto weights_step = [](auto work) { return classify_errors(ErrorKind::kCheckpoint, work); };
  std::string chosen_because;
  const safetensors::File weights =
      weights_step([&] { return read_weights_on_root(rt.control(), c.weights, &chosen_because); });
  const GptSpec spec = weights_step([&] {
    return agreed([&] {
      const GptSpec s = sample_gpt_spec(weights.metadata(), weights.source());
      check_gpt_weights_fit(weights, s);
      return s;
    });
  });
  std::unique_ptr<Gpt> model = build_gpt(spec, rt.device(), 0);
  weights_step([&] { agreed([&] { load_parameters(weights, *model); }); });
  model->set_training(false);
  const bool printing = rt.rank() == 0;
  if (printing && !chosen_because.empty()) fmt::print(stderr, "weights: {}\n", chosen_because);

  std::vector<int32_t> text;
  for (unsigned char byte : c.prompt) text.push_back(byte);
  if (printing) std::fwrite(c.prompt.data(), 1, c.prompt.size(), stdout);
  std::vector<int32_t> generated;
  for (int64_t i = 0; i < c.tokens; ++i) {
    // The window: the last `context` tokens, as the model saw sequences in training.
    const auto n = static_cast<int64_t>(std::min<size_t>(text.size(), static_cast<size_t>(spec.context)));
    Tensor window = Tensor::empty({1, n}, Device::cpu(), DType::kI32);
    std::copy(text.end() - n, text.end(), window.data_as<int32_t>());
    const Tensor logits = model->forward(window.to(rt.device()));  // [n, V]
    const int32_t next = sample_token(logits_row(logits, n - 1), c.sampling, static_cast<uint64_t>(i));
    text.push_back(next);
    generated.push_back(next);
    if (printing) {
      const auto byte = static_cast<char>(next);
      std::fwrite(&byte, 1, 1, stdout);
      std::fflush(stdout);  // the text appears as it is written
    }
  }
  if (printing) std::fputc('\n', stdout);
  std::fflush(stdout);
  return generated;
}

}  // namespace dtrain
