#include "app/eval_command.h"

#include <cmath>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "app/checkpointing.h"
#include "app/train_options.h"
#include "core/command_line.h"
#include "core/error.h"
#include "data/mnist.h"
#include "train/root_broadcast.h"

namespace dtrain {

namespace {

cxxopts::Options make_eval_options() {
  cxxopts::Options o("dtrain eval", "Test-set loss and accuracy of trained weights (a safetensors file or a checkpoint).");
  // clang-format off
  o.add_options()
    ("weights", "FILE.safetensors, a checkpoint (DIR/step-N) or a checkpoint directory (its latest)", cxxopts::value<std::string>())
    ("data", "Folder with the t10k-{images-idx3,labels-idx1}-ubyte[.gz] files", cxxopts::value<std::string>()->default_value(DataSettings{}.dir))
    ("test-limit", "Use only the first N test samples (0: all)", cxxopts::value<int64_t>()->default_value("0"))
    ("model", "mlp or cnn (only for files that do not record their architecture)", cxxopts::value<std::string>())
    ("hidden", "MLP hidden widths, comma separated (idem)", cxxopts::value<std::string>())
    ("dropout", "Dropout probability the model was built with (idem; it numbers the layers)", cxxopts::value<std::string>())
    ("normalize", "Pixel mean,std the model was trained with (idem)", cxxopts::value<std::string>())
    ("device", "auto, cpu, cuda or cuda:N", cxxopts::value<std::string>()->default_value("auto"))
    ("threads", "CPU BLAS threads per rank (0: cores / local ranks)", cxxopts::value<int>()->default_value("0"))
    ("h,help", "Show this help");
  // clang-format on
  return o;
}

std::string widths_text(const std::vector<int64_t>& w) { return fmt::format("{}", fmt::join(w, ",")); }

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
  const TrainConfig t = parse_train_options(shared).config;
  EvalConfig& c = out.config;
  if (!r.count("weights")) throw UsageError("--weights: required (FILE.safetensors or a checkpoint directory)");
  c.weights = r["weights"].as<std::string>();
  c.data_dir = t.data.dir;
  c.test_limit = r["test-limit"].as<int64_t>();
  if (c.test_limit < 0) throw UsageError("--test-limit: must be non-negative");
  c.runtime = t.runtime;
  if (r.count("model")) c.flags.model = t.model.kind;
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
  // The weights' failures (damaged, or made for another model or data) are the file's, the
  // data's are the data's: a restart would fail the same way (core/exit_status.h).
  auto weights_step = [](auto work) { return classify_errors(ErrorKind::kCheckpoint, work); };
  auto data_step = [](auto work) { return classify_errors(ErrorKind::kData, work); };
  const safetensors::File weights =
      weights_step([&] { return read_weights_on_root(rt.control(), c.weights, &chosen_because); });
  if (rt.rank() == 0 && !chosen_because.empty()) fmt::print("weights: {}\n", chosen_because);
  // The data's shape does not depend on normalisation: read it with the default, then again
  // with the architecture's.
  std::unique_ptr<MnistDataset> test =
      data_step([&] { return MnistDataset::load(c.data_dir, Split::kTest, {}, c.test_limit); });
  const Architecture arch = weights_step([&] {
    return agreed([&] {
      return resolve_architecture(architecture_from_metadata(weights.metadata(), weights.source()), c.flags,
                                  test->sample_shape(), test->num_classes(), weights.source());
    });
  });
  // The file's shapes against the architecture before the model exists: metadata that claims a
  // model far larger than its tensors fails here, having allocated nothing.
  weights_step([&] { agreed([&] { check_weights_fit(weights, arch); }); });
  test = data_step([&] { return MnistDataset::load(c.data_dir, Split::kTest, arch.normalize, c.test_limit); });
  std::unique_ptr<Sequential> model = build_model(arch.model, arch.input_shape, arch.classes, rt.device(), 0);
  weights_step([&] {
    agreed([&] {
      std::vector<safetensors::NamedTarget> targets;
      for (Parameter* p : model->parameters()) targets.push_back({p->name, &p->value});
      safetensors::load_named(weights, targets);
    });
  });
  const Evaluation eval = evaluate(*model, *test, rt.control(), rt.device());
  if (rt.rank() == 0) fmt::print("{}\n", test_set_line(eval, test->size()));
  std::fflush(stdout);
  return eval;
}

}  // namespace dtrain
