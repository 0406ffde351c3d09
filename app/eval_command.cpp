#include "app/eval_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "app/checkpointing.h"
#include "app/lm_batches.h"
#include "app/train_options.h"
#include "core/command_line.h"
#include "core/error.h"
#include "data/data_format.h"
#include "data/mnist.h"
#include "data/npy_dataset.h"
#include "train/root_broadcast.h"

namespace dtrain {

namespace {

cxxopts::Options make_eval_options() {
  cxxopts::Options o("dtrain eval", "Test-set loss and accuracy of trained weights (a safetensors file or a checkpoint).");
  // clang-format off
  o.add_options()
    ("weights", "FILE.safetensors, a checkpoint (DIR/step-N) or a checkpoint directory (its latest)", cxxopts::value<std::string>())
    ("data", "Folder with the t10k-{images-idx3,labels-idx1}-ubyte[.gz] files, or NumPy arrays test_{x,y}.npy or test.npz (GPT weights: the *val*.bin token shards)", cxxopts::value<std::string>()->default_value(DataSettings{}.dir))
    ("test-limit", "Use only the first N test samples (0: all)", cxxopts::value<int64_t>()->default_value("0"))
    ("eval-batches", "GPT weights: only the first N validation slots (0: all)", cxxopts::value<int64_t>()->default_value("0"))
    ("batch-size", "GPT weights: sequences per validation slot (default 8, as dtrain train --model gpt)", cxxopts::value<int64_t>())
    ("model", "mlp or cnn (only for files that do not record their architecture); gpt", cxxopts::value<std::string>())
    ("hidden", "MLP hidden widths, comma separated (idem)", cxxopts::value<std::string>())
    ("dropout", "Dropout probability the model was built with (idem; it numbers the layers)", cxxopts::value<std::string>())
    ("normalize", "Pixel mean,std the model was trained with (idem)", cxxopts::value<std::string>())
    ("device", "auto, cpu, cuda or cuda:N", cxxopts::value<std::string>()->default_value("auto"))
    ("threads", "CPU BLAS threads per rank (0: cores / local ranks)", cxxopts::value<int>()->default_value("0"))
    ("h,help", "Show this help");
  // clang-format on
  return o;
}

// What --data holds; nullopt for neither format (or no folder): the loaders say what is wrong.
std::optional<DataFormat> detected_format(const std::string& dir) {
  try {
    return detect_data_format(dir);
  } catch (const Error&) {
    return std::nullopt;
  }
}

bool holds_token_shards(const std::string& dir) { return detected_format(dir) == DataFormat::kLlmc; }

// The test split of an image data set, NumPy arrays or IDX files.
std::unique_ptr<Dataset> load_test_split(const std::string& dir, Normalize norm, int64_t limit) {
  // A folder of the test split alone is eval's data too (as with IDX files): look for it, not
  // for the training arrays data format detection looks for.
  if (detected_format(dir) == DataFormat::kNpy || has_npy_test_data(dir)) return load_npy_test_split(dir, norm, limit);
  return MnistDataset::load(dir, Split::kTest, norm, limit);
}

std::string widths_text(const std::vector<int64_t>& w) { return fmt::format("{}", fmt::join(w, ",")); }

// The failures of the weights (damaged, or made for another model or data) are the file's, the
// data's are the data's: a restart would fail the same way (core/exit_status.h).
template <class Work>
auto weights_step(Work&& work) {
  return classify_errors(ErrorKind::kCheckpoint, work);
}
template <class Work>
auto data_step(Work&& work) {
  return classify_errors(ErrorKind::kData, work);
}

// GPT weights: the validation loss over the token shards' val slots, as the trainer computes it.
Evaluation eval_language_model(Runtime& rt, const EvalConfig& c, const safetensors::File& weights, const GptSpec& spec) {
  weights_step([&] {
    agreed([&] {
      const ArchitectureFlags& f = c.flags;
      if (f.model || f.hidden || f.dropout || f.normalize)
        throw Error(fmt::format("{}: a GPT (the metadata says so); --model, --hidden, --dropout and --normalize "
                                "describe image models",
                                weights.source()));
      check_gpt_weights_fit(weights, spec);
    });
  });
  TrainConfig t;  // the trainer's data settings: val slots of B sequences of the model's context
  t.data.dir = c.data_dir;
  t.data.shuffle = false;
  t.batch_size = c.batch_size.value_or(8);
  t.lm.emplace();
  t.lm->context = spec.context;
  t.lm->vocab = spec.vocab;
  LmBatches data = open_lm_batches(rt, t);
  std::unique_ptr<Gpt> model = build_gpt(spec, rt.device(), 0);
  weights_step([&] { agreed([&] { load_parameters(weights, *model); }); });
  const int64_t slots = c.eval_batches > 0 ? std::min(c.eval_batches, data.val_slots()) : data.val_slots();
  const double loss = lm_validation_loss(*model, data, slots, rt.control());
  if (rt.rank() == 0)
    fmt::print("val loss {:.6f} | perplexity {:.2f} | {} slots of {}x{} tokens\n", loss, std::exp(loss), slots,
               t.batch_size, spec.context);
  std::fflush(stdout);
  return {loss, 0, slots};
}

}  // namespace

ParsedEval parse_eval_options(const std::vector<std::string>& args) {
  cxxopts::Options options = make_eval_options();
  const ParsedFlags flags = parse_flags(options, args);
  ParsedEval out;
  if (flags.help) {
    out.help = true;
    out.help_text = flags.help_text;
    return out;
  }
  const cxxopts::ParseResult& r = flags.result;
  // The train flags' own parser checks the shared ones, so both commands read them alike.
  std::vector<std::string> shared = {"--data", r["data"].as<std::string>(), "--device", r["device"].as<std::string>(),
                                     "--threads", std::to_string(r["threads"].as<int>())};
  for (const char* flag : {"model", "hidden", "dropout", "normalize"})
    if (r.count(flag)) shared.insert(shared.end(), {std::string("--") + flag, r[flag].as<std::string>()});
  // A folder of token shards is --model gpt's data: the train parser takes it as that (an image
  // flag beside it is then its one line), unless --model says otherwise (then that is refused).
  if (!r.count("model") && holds_token_shards(r["data"].as<std::string>()))
    shared.insert(shared.end(), {"--model", "gpt"});
  const TrainConfig t = parse_train_options(shared).config;
  EvalConfig& c = out.config;
  if (!r.count("weights")) throw UsageError("--weights: required (FILE.safetensors or a checkpoint directory)");
  c.weights = r["weights"].as<std::string>();
  c.data_dir = t.data.dir;
  c.test_limit = r["test-limit"].as<int64_t>();
  if (c.test_limit < 0) throw UsageError("--test-limit: must be non-negative");
  c.eval_batches = r["eval-batches"].as<int64_t>();
  if (c.eval_batches < 0) throw UsageError(fmt::format("--eval-batches: must be non-negative (0: all), got {}", c.eval_batches));
  if (r.count("batch-size")) {
    c.batch_size = r["batch-size"].as<int64_t>();
    if (*c.batch_size < 1) throw UsageError(fmt::format("--batch-size: must be at least 1, got {}", *c.batch_size));
  }
  c.runtime = t.runtime;
  if (r.count("model")) {
    if (t.lm)
      c.model_gpt = true;  // --model gpt: the file must say so too
    else
      c.flags.model = t.model.kind;
  }
  if (r.count("hidden")) c.flags.hidden = t.model.hidden;
  if (r.count("dropout")) c.flags.dropout = t.model.dropout;
  if (r.count("normalize")) c.flags.normalize = t.data.normalize;
  return out;
}

Architecture resolve_architecture(const std::optional<Architecture>& recorded, const ArchitectureFlags& flags,
                                  const Shape& input_shape, int classes, const std::string& source) {
  if (!recorded) {
    Architecture a;
    a.model.kind = flags.model.value_or(ModelKind::kMlp);
    if (flags.hidden) a.model.hidden = *flags.hidden;
    a.model.dropout = flags.dropout.value_or(0.f);
    a.normalize = flags.normalize.value_or(Normalize{});
    a.input_shape = input_shape;
    a.classes = classes;
    return a;
  }
  const Architecture& a = *recorded;
  auto disagree = [&](const char* flag, const std::string& given, const std::string& saved) {
    throw Error(fmt::format("{}: {} {} disagrees with the weights (recorded: {})", source, flag, given, saved));
  };
  if (flags.model && *flags.model != a.model.kind)
    disagree("--model", model_kind_name(*flags.model), model_kind_name(a.model.kind));
  if (flags.hidden && a.model.kind == ModelKind::kMlp && *flags.hidden != a.model.hidden)
    disagree("--hidden", widths_text(*flags.hidden), widths_text(a.model.hidden));
  if (flags.dropout && *flags.dropout != a.model.dropout)
    disagree("--dropout", fmt::format("{}", *flags.dropout), fmt::format("{}", a.model.dropout));
  if (flags.normalize && (flags.normalize->mean != a.normalize.mean || flags.normalize->std != a.normalize.std))
    disagree("--normalize", fmt::format("{},{}", flags.normalize->mean, flags.normalize->std),
             fmt::format("{},{}", a.normalize.mean, a.normalize.std));
  // Fewer classes in the test labels than the weights know is fine (a model trained with --classes).
  if (a.input_shape != input_shape || a.classes < classes)
    throw Error(fmt::format("{}: the weights take {} inputs in {} classes, the data has {} in {}", source,
                            shape_str(a.input_shape), a.classes, shape_str(input_shape), classes));
  return a;
}

Evaluation run_eval(Runtime& rt, const EvalConfig& c) {
  std::string chosen_because;
  const safetensors::File weights =
      weights_step([&] { return read_weights_on_root(rt.control(), c.weights, &chosen_because); });
  if (rt.rank() == 0 && !chosen_because.empty()) fmt::print("weights: {}\n", chosen_because);
  const std::optional<GptSpec> gpt =
      weights_step([&] { return agreed([&] { return gpt_spec_from_metadata(weights.metadata(), weights.source()); }); });
  if (gpt) return eval_language_model(rt, c, weights, *gpt);
  if (c.eval_batches > 0 || c.batch_size || c.model_gpt)
    throw AgreedError(fmt::format("{}: --model gpt, --eval-batches and --batch-size are for GPT weights (the file "
                                  "records no dtrain.model=gpt)",
                                  weights.source()),
                      ErrorKind::kUsage);  // the broadcast file: every rank sees it alike
  // The data's shape does not depend on normalisation: read it with the default, then again
  // with the architecture's.
  std::unique_ptr<Dataset> test = data_step([&] { return load_test_split(c.data_dir, {}, c.test_limit); });
  const Architecture arch = weights_step([&] {
    return agreed([&] {
      return resolve_architecture(architecture_from_metadata(weights.metadata(), weights.source()), c.flags,
                                  test->sample_shape(), test->num_classes(), weights.source());
    });
  });
  // The file's shapes against the architecture before the model exists: metadata that claims a
  // model far larger than its tensors fails here, having allocated nothing.
  weights_step([&] { agreed([&] { check_weights_fit(weights, arch); }); });
  test = data_step([&] { return load_test_split(c.data_dir, arch.normalize, c.test_limit); });
  std::unique_ptr<Sequential> model = build_model(arch.model, arch.input_shape, arch.classes, rt.device(), 0);
  weights_step([&] { agreed([&] { load_parameters(weights, *model); }); });
  const Evaluation eval = evaluate(*model, *test, rt.control(), rt.device());
  if (rt.rank() == 0) fmt::print("{}\n", test_set_line(eval, test->size()));
  std::fflush(stdout);
  return eval;
}

}  // namespace dtrain
