#include "examples/train_options.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include <cxxopts.hpp>
#include <fmt/format.h>

#include "core/error.h"

namespace dtrain {

namespace {

// Sanity bounds on size flags: far beyond any real job, yet small enough that every product
// the trainer forms from them (batch x sample, width x width) stays well inside 64 bits.
constexpr int64_t kMaxBatchSize = int64_t{1} << 20;
constexpr int64_t kMaxWidth = int64_t{1} << 20;

std::vector<int64_t> parse_widths(const std::string& text) {
  std::vector<int64_t> widths;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    std::string item = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v <= 0)
      throw UsageError(fmt::format("--hidden: expected positive widths like 256 or 1024,1024, got '{}'", text));
    if (v > kMaxWidth) throw UsageError(fmt::format("--hidden: widths must be at most {}, got {}", kMaxWidth, v));
    widths.push_back(v);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return widths;
}

// cxxopts names a value that failed to convert ("Argument 'x' failed to parse") but not its
// flag: find the flag in `args` that carried it, as "--flag value" or "--flag=value".
std::string bad_value_message(const std::vector<std::string>& args, const std::string& what) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) continue;
    const size_t eq = a.find('=');
    const std::string flag = a.substr(0, eq);
    const std::string value = eq != std::string::npos ? a.substr(eq + 1) : i + 1 < args.size() ? args[i + 1] : "";
    for (const std::string& quoted : {"\u2018" + value + "\u2019", "'" + value + "'"})
      if (what.find(quoted) != std::string::npos) {
        // A value that reads as a decimal failed, so the flag takes whole numbers.
        char* end = nullptr;
        std::strtod(value.c_str(), &end);
        const bool decimal = !value.empty() && end == value.c_str() + value.size();
        return fmt::format("{}: expected {}, got '{}'", flag, decimal ? "a whole number" : "a number", value);
      }
  }
  return what;
}

}  // namespace

ParsedTrain parse_train_options(const std::vector<std::string>& args) {
  TrainConfig d;  // defaults
  cxxopts::Options o("dtrain train", "Data-parallel training on (Fashion-)MNIST; data-parallel whenever started "
                                     "with more than one rank (dtrain-launch, mpirun or srun).");
  // clang-format off
  o.add_options("Data")
    ("data", "Folder with {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]", cxxopts::value<std::string>()->default_value(d.data_dir))
    ("train-limit", "Use only the first N training samples (0: all)", cxxopts::value<int64_t>()->default_value("0"))
    ("test-limit", "Use only the first N test samples (0: all)", cxxopts::value<int64_t>()->default_value("0"))
    ("normalize", "Pixel mean,std applied after scaling to [0,1] (e.g. 0.2860,0.3530)", cxxopts::value<std::string>()->default_value(""));
  o.add_options("Model")
    ("model", "mlp or cnn", cxxopts::value<std::string>()->default_value("mlp"))
    ("hidden", "MLP hidden widths, comma separated", cxxopts::value<std::string>()->default_value("256"))
    ("dropout", "Dropout probability after hidden activations", cxxopts::value<float>()->default_value("0"))
    ("seed", "Seed for initialisation, shuffling and dropout", cxxopts::value<uint64_t>()->default_value("0"));
  o.add_options("Optimisation")
    ("epochs", "Epochs", cxxopts::value<int64_t>()->default_value("1"))
    ("batch-size", "Batch size per rank", cxxopts::value<int64_t>()->default_value("64"))
    ("optimizer", "sgd or adamw", cxxopts::value<std::string>()->default_value("sgd"))
    ("lr", "Learning rate", cxxopts::value<float>()->default_value("0.01"))
    ("momentum", "SGD momentum", cxxopts::value<float>()->default_value("0.9"))
    ("nesterov", "SGD with Nesterov momentum")
    ("weight-decay", "Weight decay (L2 for SGD, decoupled for AdamW)", cxxopts::value<float>()->default_value("0"))
    ("lr-schedule", "none, step or cosine (per epoch)", cxxopts::value<std::string>()->default_value("none"))
    ("lr-step-size", "step: epochs between decays", cxxopts::value<int64_t>()->default_value("1"))
    ("lr-gamma", "step: decay factor", cxxopts::value<float>()->default_value("0.1"))
    ("accumulate", "Micro-batches per optimizer step (gradients accumulate under no_sync)", cxxopts::value<int64_t>()->default_value("1"));
  o.add_options("Distributed")
    ("bucket-cap-mb", "Gradient bucket cap in MiB (the first bucket is 1 MiB)", cxxopts::value<double>()->default_value("25"))
    ("find-unused-parameters", "Treat parameters without a gradient in a step as ready with zero gradient")
    ("comm-hook", "Gradient reduction: allreduce, bf16 or fp16 (compressed)", cxxopts::value<std::string>()->default_value("allreduce"))
    ("trace", "Write a Chrome trace JSON (all ranks) to FILE", cxxopts::value<std::string>()->default_value(""));
  o.add_options("Device")
    ("device", "auto, cpu, cuda or cuda:N (auto: CUDA when visible, else CPU)", cxxopts::value<std::string>()->default_value("auto"))
    ("allow-gpu-sharing", "Let several local ranks share a GPU")
    ("tf32", "Allow TF32 tensor cores for float32 GEMM on GPU")
    ("amp", "Mixed precision: off, or bf16 (Linear matmuls in bf16, float32 weights; emulated on CPU)", cxxopts::value<std::string>()->default_value("off"))
    ("timeout", "Seconds before a stuck NCCL collective aborts the job", cxxopts::value<double>()->default_value("600"))
    ("threads", "CPU BLAS threads per rank (0: cores / local ranks)", cxxopts::value<int>()->default_value("0"));
  o.add_options("Output")
    ("log-interval", "Batches between log lines", cxxopts::value<int64_t>()->default_value("100"))
    ("json", "Print a final JSON summary line")
    ("quiet", "Only errors (and --json)")
    ("h,help", "Show this help");
  // clang-format on

  std::vector<const char*> argv = {"dtrain train"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  ParsedTrain out;
  cxxopts::ParseResult r;
  try {
    r = o.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const cxxopts::exceptions::incorrect_argument_type& e) {
    throw UsageError(bad_value_message(args, e.what()));
  } catch (const cxxopts::exceptions::exception& e) {
    throw UsageError(e.what());
  }
  if (!r.unmatched().empty()) throw UsageError(fmt::format("unexpected argument '{}'", r.unmatched().front()));
  if (r.count("help")) {
    out.help = true;
    out.help_text = o.help();
    return out;
  }

  TrainConfig& c = out.config;
  c.data_dir = r["data"].as<std::string>();
  c.train_limit = r["train-limit"].as<int64_t>();
  c.test_limit = r["test-limit"].as<int64_t>();
  c.model.name = r["model"].as<std::string>();
  c.model.hidden = parse_widths(r["hidden"].as<std::string>());
  c.model.dropout = r["dropout"].as<float>();
  c.seed = r["seed"].as<uint64_t>();
  c.epochs = r["epochs"].as<int64_t>();
  c.batch_size = r["batch-size"].as<int64_t>();
  c.optimizer = r["optimizer"].as<std::string>();
  c.lr = r["lr"].as<float>();
  c.momentum = r["momentum"].as<float>();
  c.nesterov = r.count("nesterov") > 0;
  c.weight_decay = r["weight-decay"].as<float>();
  c.lr_schedule = LrSchedule::parse_kind(r["lr-schedule"].as<std::string>());
  c.lr_step_size = r["lr-step-size"].as<int64_t>();
  c.lr_gamma = r["lr-gamma"].as<float>();
  c.accumulate = r["accumulate"].as<int64_t>();
  c.bucket_cap_mb = r["bucket-cap-mb"].as<double>();
  c.find_unused_parameters = r.count("find-unused-parameters") > 0;
  c.comm_hook = r["comm-hook"].as<std::string>();
  c.trace_path = r["trace"].as<std::string>();
  c.device = r["device"].as<std::string>();
  c.allow_gpu_sharing = r.count("allow-gpu-sharing") > 0;
  c.tf32 = r.count("tf32") > 0;
  const std::string amp = r["amp"].as<std::string>();
  c.timeout_s = r["timeout"].as<double>();
  c.threads = r["threads"].as<int>();
  c.log_interval = r["log-interval"].as<int64_t>();
  c.json = r.count("json") > 0;
  c.quiet = r.count("quiet") > 0;

  auto require = [](bool ok, std::string message) {
    if (!ok) throw UsageError(std::move(message));
  };
  require(c.epochs >= 1, fmt::format("--epochs: must be at least 1, got {}", c.epochs));
  require(c.batch_size >= 1, fmt::format("--batch-size: must be at least 1, got {}", c.batch_size));
  require(c.batch_size <= kMaxBatchSize, fmt::format("--batch-size: must be at most {}, got {}", kMaxBatchSize, c.batch_size));
  require(std::isfinite(c.lr) && c.lr > 0.f, fmt::format("--lr: must be positive, got {}", c.lr));
  require(c.momentum >= 0.f && c.momentum < 1.f, fmt::format("--momentum: must be in [0, 1), got {}", c.momentum));
  require(c.weight_decay >= 0.f, fmt::format("--weight-decay: must be non-negative, got {}", c.weight_decay));
  require(c.model.name == "mlp" || c.model.name == "cnn", fmt::format("--model: expected mlp or cnn, got '{}'", c.model.name));
  require(c.optimizer == "sgd" || c.optimizer == "adamw",
          fmt::format("--optimizer: expected sgd or adamw, got '{}'", c.optimizer));
  require(!c.nesterov || c.optimizer == "sgd", "--nesterov: only with --optimizer sgd");
  require(!c.nesterov || c.momentum > 0.f, "--nesterov: needs --momentum > 0");
  require(c.model.dropout >= 0.f && c.model.dropout < 1.f, fmt::format("--dropout: must be in [0, 1), got {}", c.model.dropout));
  require(c.lr_step_size >= 1, fmt::format("--lr-step-size: must be at least 1, got {}", c.lr_step_size));
  require(c.accumulate >= 1, fmt::format("--accumulate: must be at least 1, got {}", c.accumulate));
  require(c.bucket_cap_mb > 0 && c.bucket_cap_mb <= 1e6,
          fmt::format("--bucket-cap-mb: must be in (0, 1e6], got {}", c.bucket_cap_mb));
  require(std::isfinite(c.lr_gamma) && c.lr_gamma > 0.f, fmt::format("--lr-gamma: must be positive, got {}", c.lr_gamma));
  require(c.comm_hook == "allreduce" || c.comm_hook == "bf16" || c.comm_hook == "fp16",
          fmt::format("--comm-hook: expected allreduce, bf16 or fp16, got '{}'", c.comm_hook));
  require(c.log_interval >= 1, fmt::format("--log-interval: must be at least 1, got {}", c.log_interval));
  require(c.train_limit >= 0 && c.test_limit >= 0, "--train-limit/--test-limit: must be non-negative");
  require(c.timeout_s > 0 && c.timeout_s <= 1e7, fmt::format("--timeout: must be in (0, 1e7] seconds, got {}", c.timeout_s));
  require(amp == "off" || amp == "bf16", fmt::format("--amp: expected off or bf16, got '{}'", amp));
  c.amp = amp == "bf16" ? AmpMode::kBf16 : AmpMode::kOff;
  require(c.threads >= 0, fmt::format("--threads: must be non-negative, got {}", c.threads));
  require(std::filesystem::is_directory(c.data_dir),
          fmt::format("--data: no such directory '{}' (Debian: apt-get install dataset-fashion-mnist)", c.data_dir));
  const std::string norm = r["normalize"].as<std::string>();
  if (!norm.empty()) {
    float mean = 0, std = 0;
    char extra = 0;
    require(std::sscanf(norm.c_str(), "%f,%f%c", &mean, &std, &extra) == 2 && std::isfinite(mean) &&
                std::isfinite(std) && std > 0.f,
            fmt::format("--normalize: expected MEAN,STD with STD > 0, got '{}'", norm));
    c.norm_mean = mean;
    c.norm_std = std;
  }
  return out;
}

}  // namespace dtrain
