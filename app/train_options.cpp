#include "app/train_options.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>

#include <fmt/format.h>

#include "app/pipeline_zero.h"
#include "core/command_line.h"
#include "core/error.h"

namespace dtrain {

namespace {

// Sanity bounds on size flags: far beyond any real job, yet small enough that every product
// the trainer forms from them (batch x sample, width x width) stays well inside 64 bits.
constexpr int64_t kMaxBatchSize = int64_t{1} << 20;
constexpr int64_t kMaxWidth = int64_t{1} << 20;
constexpr int64_t kMaxClasses = 1'000'000;  // as many as a weights file may record (app/architecture.cpp)

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

void require(bool ok, const std::string& message) {
  if (!ok) throw UsageError(message);
}

// A float flag's value, the whole text a finite number: cxxopts reads floats with a stream, which
// stops at the first bad character ("0.5abc" is 0.5) and fails on "nan" in words meant for whole
// numbers. Range checks are the caller's.
double parse_number(const std::string& flag, const std::string& text) {
  // from_chars takes no leading '+'; a user may well write one.
  const char* begin = text.data() + (text.starts_with('+') && text.size() > 1 && text[1] != '-' ? 1 : 0);
  const char* end = text.data() + text.size();
  double v = 0;
  const auto [ptr, ec] = std::from_chars(begin, end, v);
  if (text.empty() || ptr != end || (ec != std::errc() && ec != std::errc::result_out_of_range))
    throw UsageError(fmt::format("{}: expected a number, got '{}'", flag, text));
  if (ec == std::errc::result_out_of_range)
    throw UsageError(fmt::format("{}: '{}' is out of range for a number", flag, text));
  if (!std::isfinite(v)) throw UsageError(fmt::format("{}: expected a finite number, got '{}'", flag, text));
  return v;
}

// A float flag of `r` (declared as text), checked as parse_number checks it, as a float: one
// beyond float's range is refused rather than made infinite.
float float_flag(const cxxopts::ParseResult& r, const char* name) {
  const std::string flag = std::string("--") + name;
  const std::string text = r[name].as<std::string>();
  const double v = parse_number(flag, text);
  if (std::fabs(v) > std::numeric_limits<float>::max())
    throw UsageError(fmt::format("{}: '{}' is out of range for a number", flag, text));
  return static_cast<float>(v);
}

// One of `names` (a parse function's vocabulary) or a UsageError listing them.
template <class Parse>
auto parse_choice(const std::string& flag, const std::string& value, Parse parse, const char* expected) {
  auto kind = parse(value);
  if (!kind) throw UsageError(fmt::format("{}: expected {}, got '{}'", flag, expected, value));
  return *kind;
}

cxxopts::Options make_train_options() {
  TrainConfig d;  // defaults
  cxxopts::Options o("dtrain train", "Data-parallel training on (Fashion-)MNIST; data-parallel whenever started "
                                     "with more than one rank (dtrain-launch, mpirun or srun).");
  // clang-format off
  o.add_options("Data")
    ("data", "Folder with {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz], NumPy arrays ({train,test}_{x,y}.npy or {train,test}.npz), or (--model gpt) llm.c token shards *train*.bin and *val*.bin", cxxopts::value<std::string>()->default_value(d.data.dir))
    ("data-format", "auto, idx, npy (NumPy arrays) or llmc (token shards); auto: what --data holds", cxxopts::value<std::string>()->default_value("auto"))
    ("train-limit", "Use only the first N training samples (0: all)", cxxopts::value<int64_t>()->default_value("0"))
    ("test-limit", "Use only the first N test samples (0: all)", cxxopts::value<int64_t>()->default_value("0"))
    ("normalize", "Pixel mean,std applied after scaling to [0,1] (e.g. 0.2860,0.3530)", cxxopts::value<std::string>()->default_value(""))
    ("shuffle", "on: a seeded shuffle per epoch; off: rank r takes samples r, r+N, ... in order (PyTorch's DistributedSampler(shuffle=False))", cxxopts::value<std::string>()->default_value("on"))
    ("classes", "Classes of the model (0: the largest training label + 1, and a label far above the others is an error); every label must be below it", cxxopts::value<int64_t>()->default_value("0"))
    ("sampler", "The epoch's last N mod ranks samples: pad (repeat some, as PyTorch), drop-last, or uneven (ranks run different numbers of steps; Join)", cxxopts::value<std::string>()->default_value("pad"));
  o.add_options("Model")
    ("model", "mlp, cnn, resnet18 (torchvision's ResNet-18 with BatchNorm, 3x3 stem for small images) or gpt (a GPT-2-style language model on token shards)", cxxopts::value<std::string>()->default_value("mlp"))
    ("width", "resnet18: channels of its first stage (torchvision's is 64)", cxxopts::value<int64_t>()->default_value("16"))
    ("layers", "gpt: transformer blocks", cxxopts::value<int64_t>()->default_value("4"))
    ("heads", "gpt: attention heads (a divisor of --embd)", cxxopts::value<int64_t>()->default_value("4"))
    ("embd", "gpt: embedding width", cxxopts::value<int64_t>()->default_value("256"))
    ("context", "gpt: tokens per sequence", cxxopts::value<int64_t>()->default_value("256"))
    ("vocab", "gpt: vocabulary size (0: from the data: 256 for byte shards, 50257 for GPT-2 tokens)", cxxopts::value<int64_t>()->default_value("0"))
    ("hidden", "MLP hidden widths, comma separated", cxxopts::value<std::string>()->default_value("256"))
    ("memory-per-rank", "The most memory one rank's model training state may take, e.g. 4G or 512M; a larger model is refused at start-up (default: this machine's memory / ranks on it)", cxxopts::value<std::string>()->default_value(""))
    ("dropout", "Dropout probability after hidden activations", cxxopts::value<std::string>()->default_value("0"))
    ("seed", "Seed for initialisation, shuffling and dropout", cxxopts::value<uint64_t>()->default_value("0"));
  o.add_options("Optimisation")
    ("epochs", "Epochs (mlp, cnn)", cxxopts::value<int64_t>()->default_value("1"))
    ("steps", "gpt: optimizer steps", cxxopts::value<int64_t>()->default_value("500"))
    ("batch-size", "Batch size per rank (gpt: sequences; default 64, gpt 8)", cxxopts::value<int64_t>()->default_value("64"))
    ("optimizer", "sgd or adamw (default sgd, gpt adamw)", cxxopts::value<std::string>()->default_value("sgd"))
    ("lr", "Learning rate (default 0.01, gpt 1e-3)", cxxopts::value<std::string>()->default_value("0.01"))
    ("beta2", "AdamW's second-moment decay (GPT-2 runs use 0.95)", cxxopts::value<std::string>()->default_value("0.999"))
    ("momentum", "SGD momentum", cxxopts::value<std::string>()->default_value("0.9"))
    ("nesterov", "SGD with Nesterov momentum")
    ("weight-decay", "Weight decay (L2 for SGD, decoupled for AdamW; gpt: only tensors of 2+ dimensions, as nanoGPT)", cxxopts::value<std::string>()->default_value("0"))
    ("adam-eps", "AdamW's eps, added to the denominator", cxxopts::value<std::string>()->default_value("1e-08"))
    ("lr-schedule", "none, step or cosine (per epoch; gpt: none or cosine, per step, to --min-lr at the last step)", cxxopts::value<std::string>()->default_value("none"))
    ("warmup-steps", "gpt: linear learning-rate warm-up over the first N steps", cxxopts::value<int64_t>()->default_value("0"))
    ("min-lr", "gpt, cosine: the learning rate of the last step (default --lr / 10)", cxxopts::value<std::string>()->default_value(""))
    ("clip-grad-norm", "Scale the gradients down to this global L2 norm when above it (after the all-reduce; 0: off)", cxxopts::value<std::string>()->default_value("0"))
    ("eval-every", "gpt: steps between validation losses (0: at the end only)", cxxopts::value<int64_t>()->default_value("0"))
    ("eval-batches", "gpt: validation batches per evaluation, over all ranks", cxxopts::value<int64_t>()->default_value("20"))
    ("class-weights", "Weights of the classes in the training loss, w0,w1,... one per class (gpt: per token id), as PyTorch's CrossEntropyLoss(weight=...): the weighted mean, sum of w[y] * loss / sum of w[y]", cxxopts::value<std::string>()->default_value(""))
    ("lr-step-size", "step: epochs between decays", cxxopts::value<int64_t>()->default_value("1"))
    ("lr-gamma", "step: decay factor", cxxopts::value<std::string>()->default_value("0.1"))
    ("accumulate", "Micro-batches per optimizer step (gradients accumulate under no_sync)", cxxopts::value<int64_t>()->default_value("1"));
  o.add_options("Distributed")
    ("bucket-cap-mb", "Gradient bucket cap in MiB (the first bucket is 1 MiB), or auto: try caps over the first steps and keep the fastest", cxxopts::value<std::string>()->default_value("25"))
    ("find-unused-parameters", "Treat parameters without a gradient in a step as ready with zero gradient")
    ("sync-bn", "BatchNorm statistics over all ranks' samples in training (PyTorch's SyncBatchNorm, on CPU too): np N x batch B normalises as np 1 x batch NB")
    ("broadcast-buffers", "on: rank 0's buffers (BatchNorm's running statistics) are broadcast before each step's forward, as PyTorch's DDP; off: each rank keeps its own", cxxopts::value<std::string>()->default_value("on"))
    ("comm-hook", "Gradient reduction: allreduce, bf16 or fp16 (compressed)", cxxopts::value<std::string>()->default_value("allreduce"))
    ("zero", "ZeRO: 0 off; 1 each rank keeps optimizer state for 1/N of the parameters and all-gathers its update; 2 also reduce-scatters the gradients during backward", cxxopts::value<int>()->default_value("0"))
    ("flight-recorder-dir", "Where each rank writes its last collectives on a timeout, an error or SIGUSR1", cxxopts::value<std::string>()->default_value("."))
    ("flight-recorder-size", "Collectives each rank remembers (0 with --timeout 0: no recorder and no watchdog)", cxxopts::value<int64_t>()->default_value("2000"))
    ("debug-collectives", "Check before every MPI collective that all ranks issue the same one (one small all-reduce each)")
    ("pipeline-stages", "Pipeline parallelism: cut the model into P consecutive stages on P ranks; the world is P x D (D data-parallel replicas of each stage)", cxxopts::value<int>()->default_value("1"))
    ("micro-batches", "Pipeline: micro-batches per replica's batch (at least --pipeline-stages; default: as many as stages)", cxxopts::value<int>()->default_value("0"))
    ("pipeline-schedule", "Pipeline: 1f1b or gpipe (same weights; 1f1b holds at most P micro-batches' inputs, gpipe M)", cxxopts::value<std::string>()->default_value("1f1b"))
    ("pipeline-split", "Pipeline: the first layer of stages 1..P-1 (e.g. 3,5); default: balanced by parameter count", cxxopts::value<std::string>()->default_value(""))
    ("allreduce", "CPU all-reduce: auto, flat (MPI_Allreduce), shm (one node) or hierarchical (shm in a node, MPI between nodes); auto: shm on one node, hierarchical across nodes", cxxopts::value<std::string>()->default_value("auto"));
  o.add_options("Device")
    ("device", "auto, cpu, cuda or cuda:N (auto: CUDA when visible, else CPU)", cxxopts::value<std::string>()->default_value("auto"))
    ("allow-gpu-sharing", "Let several local ranks share a GPU (local rank r on visible GPU r mod count)")
    ("tf32", "Allow TF32 tensor cores for float32 GEMM on GPU")
    ("amp", "Mixed precision: off, bf16 or fp16 (Linear and Conv matmuls in 16 bits, float32 weights and accumulation; emulated on CPU; fp16 with loss scaling)", cxxopts::value<std::string>()->default_value("off"))
    ("loss-scale", "With --amp fp16: dynamic (PyTorch's GradScaler: 2^16, halved on an inf/NaN gradient and the step skipped, doubled after --loss-scale-growth-interval good steps) or a fixed positive scale", cxxopts::value<std::string>()->default_value("dynamic"))
    ("loss-scale-growth-interval", "With --amp fp16 and a dynamic loss scale: steps without inf/NaN before the scale doubles", cxxopts::value<int64_t>()->default_value("2000"))
    ("timeout", "Seconds before a collective that has not completed ends the job, naming the ranks that did not arrive (0: never)", cxxopts::value<std::string>()->default_value("600"))
    ("threads", "CPU BLAS threads per rank (0: cores / local ranks)", cxxopts::value<int>()->default_value("0"));
  o.add_options("Checkpoints")
    ("checkpoint-dir", "Save checkpoints to DIR/step-<N> (DIR/latest names the newest)", cxxopts::value<std::string>()->default_value(""))
    ("checkpoint-every", "Optimizer steps between checkpoints (0: at every epoch end); always one at the end", cxxopts::value<int64_t>()->default_value("0"))
    ("keep", "Newest checkpoints kept", cxxopts::value<int>()->default_value("2"))
    ("checkpoint-sync", "Write checkpoints before training continues (default: on a background thread)")
    ("resume", "auto (the checkpoint DIR/latest names, or a fresh start when none) or a checkpoint PATH", cxxopts::value<std::string>()->default_value(""))
    ("init-weights", "Start from the parameters in FILE.safetensors (ignored when --resume finds a checkpoint)", cxxopts::value<std::string>()->default_value(""));
  o.add_options("Output")
    ("log-interval", "Batches between log lines", cxxopts::value<int64_t>()->default_value("100"))
    ("progress", "auto, on or off: a progress line redrawn in place (auto: when the output is a terminal)", cxxopts::value<std::string>()->default_value("auto"))
    ("metrics", "Write one JSON object per log interval and per epoch to FILE (JSON lines)", cxxopts::value<std::string>()->default_value(""))
    ("trace", "Write a Chrome trace JSON (all ranks) to FILE", cxxopts::value<std::string>()->default_value(""))
    ("json", "Print a final JSON summary line")
    ("quiet", "Only errors (and --json)")
    ("h,help", "Show this help");
  // clang-format on
  return o;
}

void read_data(const cxxopts::ParseResult& r, TrainConfig& c) {
  c.data.dir = r["data"].as<std::string>();
  c.data.train_limit = r["train-limit"].as<int64_t>();
  c.data.test_limit = r["test-limit"].as<int64_t>();
  require(c.data.train_limit >= 0 && c.data.test_limit >= 0, "--train-limit/--test-limit: must be non-negative");
  const int64_t classes = r["classes"].as<int64_t>();
  require(classes >= 0 && classes <= kMaxClasses,
          fmt::format("--classes: must be in [0, {}] (0: from the labels), got {}", kMaxClasses, classes));
  c.data.classes = static_cast<int>(classes);
  c.data.format = parse_choice("--data-format", r["data-format"].as<std::string>(), parse_data_format, "auto, idx, npy or llmc");
  if (r["model"].as<std::string>() == "gpt") {
    // The default folder is Fashion-MNIST's: a language model needs its shards named.
    require(r.count("data") > 0, "--data: --model gpt needs --data DIR with llm.c token shards (*train*.bin, *val*.bin; "
                                 "make byte-level ones with `dtrain data shard --bytes PATH -o DIR`)");
    require(std::filesystem::is_directory(c.data.dir), fmt::format("--data: no such directory '{}'", c.data.dir));
  } else {
    require(std::filesystem::is_directory(c.data.dir),
            fmt::format("--data: no such directory '{}' (Debian: apt-get install dataset-fashion-mnist)", c.data.dir));
  }
  const std::string shuffle = r["shuffle"].as<std::string>();
  require(shuffle == "on" || shuffle == "off", fmt::format("--shuffle: expected on or off, got '{}'", shuffle));
  c.data.shuffle = shuffle == "on";
  const std::string sampler = r["sampler"].as<std::string>();
  require(sampler == "pad" || sampler == "drop-last" || sampler == "uneven",
          fmt::format("--sampler: expected pad, drop-last or uneven, got '{}'", sampler));
  c.data.sampler = sampler == "uneven" ? SamplerTail::kUneven : sampler == "drop-last" ? SamplerTail::kDropLast : SamplerTail::kPad;
  const std::string norm = r["normalize"].as<std::string>();
  if (norm.empty()) return;
  float mean = 0, std = 0;
  char extra = 0;
  require(std::sscanf(norm.c_str(), "%f,%f%c", &mean, &std, &extra) == 2 && std::isfinite(mean) &&
              std::isfinite(std) && std > 0.f,
          fmt::format("--normalize: expected MEAN,STD with STD > 0, got '{}'", norm));
  c.data.normalize = {mean, std};
}

void read_model(const cxxopts::ParseResult& r, TrainConfig& c) {
  const std::string model = r["model"].as<std::string>();
  if (model == "gpt") c.lm.emplace();
  else c.model.kind = parse_choice("--model", model, parse_model_kind, "mlp, cnn, resnet18 or gpt");
  c.model.width = r["width"].as<int64_t>();
  constexpr int64_t kMaxResnetWidth = 4096;
  require(c.model.width >= 1 && c.model.width <= kMaxResnetWidth,
          fmt::format("--width: must be in [1, {}], got {}", kMaxResnetWidth, c.model.width));
  require(r.count("width") == 0 || c.model.kind == ModelKind::kResnet18, "--width: only with --model resnet18");
  for (const char* flag : {"hidden", "dropout"})
    require(r.count(flag) == 0 || c.model.kind != ModelKind::kResnet18,
            fmt::format("--{}: not with --model resnet18 (its layers are torchvision's; --width sets its size)", flag));
  c.model.hidden = parse_widths(r["hidden"].as<std::string>());
  c.model.dropout = float_flag(r, "dropout");
  require(c.model.dropout >= 0.f && c.model.dropout < 1.f,
          fmt::format("--dropout: must be in [0, 1), got {}", c.model.dropout));
  c.seed = r["seed"].as<uint64_t>();
  if (const std::string budget = r["memory-per-rank"].as<std::string>(); !budget.empty())
    c.model.memory_budget_bytes = parse_bytes("--memory-per-rank", budget, int64_t{1} << 50, "1048576G");
}

void read_optimisation(const cxxopts::ParseResult& r, TrainConfig& c) {
  c.epochs = r["epochs"].as<int64_t>();
  c.batch_size = r["batch-size"].as<int64_t>();
  c.accumulate = r["accumulate"].as<int64_t>();
  require(c.epochs >= 1, fmt::format("--epochs: must be at least 1, got {}", c.epochs));
  require(c.batch_size >= 1, fmt::format("--batch-size: must be at least 1, got {}", c.batch_size));
  require(c.batch_size <= kMaxBatchSize,
          fmt::format("--batch-size: must be at most {}, got {}", kMaxBatchSize, c.batch_size));
  require(c.accumulate >= 1, fmt::format("--accumulate: must be at least 1, got {}", c.accumulate));
  // As --batch-size: a step of 10^11 micro-batches never ends (not even at SIGTERM, which stops
  // at a step's end), and the tokens per step (B x T x accumulate x ranks) would wrap int64.
  require(c.accumulate <= kMaxBatchSize,
          fmt::format("--accumulate: must be at most {}, got {}", kMaxBatchSize, c.accumulate));
  // no_sync sums micro-batches locally (Note [ZeRO-2 gradient ring])
  c.ddp.gradient_ring = c.accumulate > 1 ? GradientRing::kWhole : GradientRing::kAuto;
  OptimizerSpec& o = c.optimizer;
  o.kind = parse_choice("--optimizer", r["optimizer"].as<std::string>(), parse_optimizer_kind, "sgd or adamw");
  o.lr = float_flag(r, "lr");
  o.momentum = float_flag(r, "momentum");
  o.nesterov = r.count("nesterov") > 0;
  o.weight_decay = float_flag(r, "weight-decay");
  o.eps = float_flag(r, "adam-eps");
  o.beta2 = float_flag(r, "beta2");
  require(o.beta2 >= 0.f && o.beta2 < 1.f, fmt::format("--beta2: must be in [0, 1), got {}", o.beta2));
  c.clip_grad_norm = float_flag(r, "clip-grad-norm");
  require(c.clip_grad_norm >= 0.f, fmt::format("--clip-grad-norm: must be non-negative (0: off), got {}", c.clip_grad_norm));
  require(std::isfinite(o.eps) && o.eps > 0.f, fmt::format("--adam-eps: must be positive, got {}", o.eps));
  require(std::isfinite(o.lr) && o.lr > 0.f, fmt::format("--lr: must be positive, got {}", o.lr));
  require(o.momentum >= 0.f && o.momentum < 1.f, fmt::format("--momentum: must be in [0, 1), got {}", o.momentum));
  require(o.weight_decay >= 0.f, fmt::format("--weight-decay: must be non-negative, got {}", o.weight_decay));
  require(!o.nesterov || o.kind == OptimizerKind::kSgd, "--nesterov: only with --optimizer sgd");
  require(!o.nesterov || o.momentum > 0.f, "--nesterov: needs --momentum > 0");
  c.lr_schedule = parse_choice("--lr-schedule", r["lr-schedule"].as<std::string>(), parse_lr_schedule_kind,
                               "none, step or cosine");
  c.lr_step_size = r["lr-step-size"].as<int64_t>();
  c.lr_gamma = float_flag(r, "lr-gamma");
  require(c.lr_step_size >= 1, fmt::format("--lr-step-size: must be at least 1, got {}", c.lr_step_size));
  require(std::isfinite(c.lr_gamma) && c.lr_gamma > 0.f, fmt::format("--lr-gamma: must be positive, got {}", c.lr_gamma));
}

// --class-weights w0,w1,...: each a finite number >= 0, at least one positive (all zero would make
// every weighted mean 0 / 0). Their count is checked once the data is read (check_class_weights).
void read_class_weights(const cxxopts::ParseResult& r, TrainConfig& c) {
  const std::string text = r["class-weights"].as<std::string>();
  if (r.count("class-weights") == 0) return;
  c.class_weights.clear();
  bool positive = false;
  for (size_t start = 0;;) {
    const size_t end = text.find(',', start);
    const std::string item = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    require(!item.empty(), fmt::format("--class-weights: expected numbers like 1,2.5,1, got '{}'", text));
    const double w = parse_number("--class-weights", item);
    require(w >= 0 && w <= std::numeric_limits<float>::max(),
            fmt::format("--class-weights: each weight must be a finite number >= 0, got {}", item));
    require(c.class_weights.size() < static_cast<size_t>(kMaxWidth),
            fmt::format("--class-weights: more than {} weights", kMaxWidth));
    c.class_weights.push_back(static_cast<float>(w));
    positive = positive || c.class_weights.back() > 0.f;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  require(positive, "--class-weights: at least one weight must be positive (all zero weigh every sample 0)");
}

void read_distributed(const cxxopts::ParseResult& r, TrainConfig& c) {
  const std::string cap = r["bucket-cap-mb"].as<std::string>();
  c.ddp.bucket_cap_auto = cap == "auto";
  if (!c.ddp.bucket_cap_auto) {
    double cap_mb = 0;
    const auto [end, ec] = std::from_chars(cap.data(), cap.data() + cap.size(), cap_mb);
    require(ec == std::errc() && end == cap.data() + cap.size() && cap_mb > 0 && cap_mb <= 1e6,
            fmt::format("--bucket-cap-mb: must be auto or a number in (0, 1e6], got '{}'", cap));
    c.ddp.bucket_cap_bytes = static_cast<size_t>(cap_mb * 1024 * 1024);
  }
  c.ddp.find_unused_parameters = r.count("find-unused-parameters") > 0;
  const std::string buffers = r["broadcast-buffers"].as<std::string>();
  require(buffers == "on" || buffers == "off", fmt::format("--broadcast-buffers: expected on or off, got '{}'", buffers));
  c.ddp.broadcast_buffers = buffers == "on";
  c.ddp.sync_batchnorm = r.count("sync-bn") > 0;
  c.ddp.comm_hook = parse_choice("--comm-hook", r["comm-hook"].as<std::string>(), parse_comm_hook_kind,
                                 "allreduce, bf16 or fp16");
  c.ddp.zero_stage = r["zero"].as<int>();
  require(c.ddp.zero_stage >= 0 && c.ddp.zero_stage <= 2, fmt::format("--zero: expected 0, 1 or 2, got {}", c.ddp.zero_stage));
  c.runtime.allreduce = parse_choice("--allreduce", r["allreduce"].as<std::string>(), parse_allreduce_algorithm,
                                     "auto, flat, shm or hierarchical");
  PipelineSettings& p = c.pipeline;
  p.stages = r["pipeline-stages"].as<int>();
  require(p.stages >= 1, fmt::format("--pipeline-stages: must be at least 1, got {}", p.stages));
  p.micro_batches = r["micro-batches"].as<int>();
  require(p.micro_batches >= 0, fmt::format("--micro-batches: must be positive, got {}", p.micro_batches));
  if (p.micro_batches == 0) p.micro_batches = p.stages;
  p.schedule = parse_choice("--pipeline-schedule", r["pipeline-schedule"].as<std::string>(), parse_pipeline_schedule,
                            "1f1b or gpipe");
  const std::string split = r["pipeline-split"].as<std::string>();
  for (size_t at = 0; !split.empty() && at <= split.size();) {
    const size_t comma = std::min(split.find(',', at), split.size());
    size_t layer = 0;
    const auto [end, ec] = std::from_chars(split.data() + at, split.data() + comma, layer);
    require(ec == std::errc() && end == split.data() + comma,
            fmt::format("--pipeline-split: expected layer numbers separated by commas, got '{}'", split));
    p.split.push_back(layer);
    at = comma + 1;
  }
  // Sub-communicators (the grid) run beside the world's: MPI_THREAD_MULTIPLE.
  c.runtime.concurrent_communicators = p.stages > 1;
}

// --loss-scale and its growth interval: PyTorch GradScaler's settings (model/grad_scaler.h), for
// --amp fp16 only (bf16 has float32's range and needs none).
void read_loss_scale(const cxxopts::ParseResult& r, TrainConfig& c) {
  GradScalerSettings& s = c.loss_scale;
  const bool fp16 = c.amp == AmpMode::kFp16;
  require(fp16 || (r.count("loss-scale") == 0 && r.count("loss-scale-growth-interval") == 0),
          fmt::format("--loss-scale and --loss-scale-growth-interval: need --amp fp16 (got --amp {})", amp_name(c.amp)));
  const std::string scale = r["loss-scale"].as<std::string>();
  s.dynamic = scale == "dynamic";
  if (!s.dynamic) {
    s.init_scale = float_flag(r, "loss-scale");
    require(s.init_scale > 0.f, fmt::format("--loss-scale: expected dynamic or a positive scale, got '{}'", scale));
  }
  s.growth_interval = r["loss-scale-growth-interval"].as<int64_t>();
  require(s.growth_interval >= 1 && s.growth_interval <= 1'000'000'000,
          fmt::format("--loss-scale-growth-interval: must be in [1, 1000000000], got {}", s.growth_interval));
  require(s.dynamic || r.count("loss-scale-growth-interval") == 0,
          "--loss-scale-growth-interval: needs a dynamic --loss-scale (a fixed scale never grows)");
}

void read_device(const cxxopts::ParseResult& r, TrainConfig& c) {
  RuntimeOptions& rt = c.runtime;
  rt.device = parse_choice("--device", r["device"].as<std::string>(), DeviceRequest::parse, "auto, cpu, cuda or cuda:N");
  rt.allow_gpu_sharing = r.count("allow-gpu-sharing") > 0;
  rt.tf32 = r.count("tf32") > 0;
  rt.collective_timeout_s = parse_number("--timeout", r["timeout"].as<std::string>());
  rt.cpu_threads = r["threads"].as<int>();
  require(rt.collective_timeout_s >= 0 && rt.collective_timeout_s <= 1e7,
          fmt::format("--timeout: must be in [0, 1e7] seconds (0: no timeout), got {}", rt.collective_timeout_s));
  rt.flight_recorder_dir = r["flight-recorder-dir"].as<std::string>();
  const int64_t recorded = r["flight-recorder-size"].as<int64_t>();
  require(recorded >= 0 && recorded <= 10'000'000,
          fmt::format("--flight-recorder-size: must be in [0, 10000000], got {}", recorded));
  rt.flight_recorder_size = static_cast<size_t>(recorded);
  rt.debug_collectives = r.count("debug-collectives") > 0;
  require(rt.cpu_threads >= 0 && rt.cpu_threads <= 4096,
          fmt::format("--threads: must be in [0, 4096] (0: the rank's share of the cores), got {}", rt.cpu_threads));
  const std::string amp = r["amp"].as<std::string>();
  require(amp == "off" || amp == "bf16" || amp == "fp16", fmt::format("--amp: expected off, bf16 or fp16, got '{}'", amp));
  c.amp = amp == "bf16" ? AmpMode::kBf16 : amp == "fp16" ? AmpMode::kFp16 : AmpMode::kOff;
  read_loss_scale(r, c);
}

void read_checkpoints(const cxxopts::ParseResult& r, TrainConfig& c) {
  CheckpointSettings& k = c.checkpoints;
  k.dir = r["checkpoint-dir"].as<std::string>();
  k.every = r["checkpoint-every"].as<int64_t>();
  k.keep = r["keep"].as<int>();
  k.background = r.count("checkpoint-sync") == 0;
  require(k.every >= 0, fmt::format("--checkpoint-every: must be non-negative, got {}", k.every));
  require(k.keep >= 1, fmt::format("--keep: must be at least 1, got {}", k.keep));
  const std::string resume = r["resume"].as<std::string>();
  k.resume = resume.empty() ? ResumeMode::kNone : resume == "auto" ? ResumeMode::kAuto : ResumeMode::kPath;
  if (k.resume == ResumeMode::kPath) k.resume_path = resume;
  require(k.resume != ResumeMode::kAuto || !k.dir.empty(), "--resume auto: needs --checkpoint-dir (where to look)");
  k.init_weights = r["init-weights"].as<std::string>();
  // The files themselves are rank 0's to read (nodes need not share a filesystem): not checked here.
}

void read_output(const cxxopts::ParseResult& r, TrainConfig& c) {
  OutputSettings& out = c.output;
  out.log_interval = r["log-interval"].as<int64_t>();
  require(out.log_interval >= 1, fmt::format("--log-interval: must be at least 1, got {}", out.log_interval));
  const std::string progress = r["progress"].as<std::string>();
  require(progress == "auto" || progress == "on" || progress == "off",
          fmt::format("--progress: expected auto, on or off, got '{}'", progress));
  out.progress = progress == "on" ? ProgressMode::kOn : progress == "off" ? ProgressMode::kOff : ProgressMode::kAuto;
  out.metrics_path = r["metrics"].as<std::string>();
  out.trace_path = r["trace"].as<std::string>();
  // Spans and metrics say what the device did: NCCL's collectives then carry timing events (on
  // CPU the times are already the collective's).
  c.runtime.device_timing = !out.trace_path.empty() || !out.metrics_path.empty();
  out.json = r.count("json") > 0;
  out.quiet = r.count("quiet") > 0;
}

// Flags that mean something for one kind of model only: given for the other, a usage error (a
// user who wrote --hidden for a GPT, or --steps for an MLP, would otherwise train something else
// than they think).
constexpr const char* kImageOnly[] = {"epochs", "hidden", "dropout", "normalize", "classes", "train-limit", "width",
                                      "test-limit", "sampler", "lr-step-size", "lr-gamma"};
constexpr const char* kLmOnly[] = {"layers", "heads", "embd", "context", "vocab", "steps",
                                   "warmup-steps", "min-lr", "eval-every", "eval-batches"};

// --model gpt: its shape and loop, and the defaults GPT users expect where the flag is not given
// (AdamW at 1e-3, 8 sequences per rank: nanoGPT's and llm.c's starting points).
void read_lm(const cxxopts::ParseResult& r, TrainConfig& c) {
  if (!c.lm) {
    for (const char* flag : kLmOnly)
      require(r.count(flag) == 0, fmt::format("--{}: only with --model gpt", flag));
    require(c.data.format != DataFormat::kLlmc, "--data-format llmc: token shards train --model gpt");
    return;
  }
  for (const char* flag : kImageOnly)
    require(r.count(flag) == 0, fmt::format("--{}: not with --model gpt ({})", flag,
                                            std::string_view(flag) == "epochs" ? "language models train --steps"
                                                                               : "an image-model flag"));
  require(c.data.format != DataFormat::kIdx && c.data.format != DataFormat::kNpy,
          fmt::format("--data-format {}: --model gpt trains on token shards (llmc)", data_format_name(c.data.format)));
  LmSettings& lm = *c.lm;
  lm.layers = r["layers"].as<int64_t>();
  lm.heads = r["heads"].as<int64_t>();
  lm.embd = r["embd"].as<int64_t>();
  lm.context = r["context"].as<int64_t>();
  lm.vocab = r["vocab"].as<int64_t>();
  lm.steps = r["steps"].as<int64_t>();
  lm.eval_every = r["eval-every"].as<int64_t>();
  lm.eval_batches = r["eval-batches"].as<int64_t>();
  constexpr int64_t kMaxLayers = 10'000;
  require(lm.layers >= 1 && lm.layers <= kMaxLayers,
          fmt::format("--layers: must be in [1, {}], got {}", kMaxLayers, lm.layers));
  for (auto [flag, v] : {std::pair{"--embd", lm.embd}, std::pair{"--context", lm.context}, std::pair{"--heads", lm.heads}})
    require(v >= 1 && v <= kMaxWidth, fmt::format("{}: must be in [1, {}], got {}", flag, kMaxWidth, v));
  require(lm.embd % lm.heads == 0,
          fmt::format("--heads: must divide --embd {} (each head takes embd / heads), got {}", lm.embd, lm.heads));
  require(lm.vocab >= 0 && lm.vocab <= kMaxWidth,
          fmt::format("--vocab: must be in [0, {}] (0: from the data), got {}", kMaxWidth, lm.vocab));
  require(lm.steps >= 1, fmt::format("--steps: must be at least 1, got {}", lm.steps));
  require(lm.eval_every >= 0, fmt::format("--eval-every: must be non-negative (0: at the end only), got {}", lm.eval_every));
  require(lm.eval_batches >= 1, fmt::format("--eval-batches: must be at least 1, got {}", lm.eval_batches));
  if (r.count("batch-size") == 0) c.batch_size = 8;
  if (r.count("optimizer") == 0) c.optimizer.kind = OptimizerKind::kAdamW;
  if (r.count("lr") == 0) c.optimizer.lr = 1e-3f;
  c.optimizer.decay_matrices_only = true;
  require(c.lr_schedule != LrSchedule::Kind::kStep, "--lr-schedule step: --model gpt takes none or cosine (per step)");
  c.warmup_steps = r["warmup-steps"].as<int64_t>();
  require(c.warmup_steps >= 0 && c.warmup_steps <= lm.steps,
          fmt::format("--warmup-steps: must be in [0, --steps {}], got {}", lm.steps, c.warmup_steps));
  c.min_lr = r["min-lr"].as<std::string>().empty() ? c.optimizer.lr / 10 : float_flag(r, "min-lr");
  require(c.min_lr >= 0.f && c.min_lr <= c.optimizer.lr,
          fmt::format("--min-lr: must be in [0, --lr {}], got {}", c.optimizer.lr, c.min_lr));
}

// --data-format auto: what DIR holds decides, and a model that cannot train on it is a usage
// error here, in one line, not a loader failure later. A folder with neither format is left to
// the loader, whose line names what is missing.
void detect_format(TrainConfig& c) {
  if (c.data.format != DataFormat::kAuto) return;
  try {
    c.data.format = detect_data_format(c.data.dir);
  } catch (const Error&) {
    return;
  }
  require(c.data.format != DataFormat::kLlmc || c.lm.has_value(),
          fmt::format("--data: {} holds llm.c token shards: use --model gpt", c.data.dir));
  require(c.data.format != DataFormat::kIdx || !c.lm.has_value(),
          fmt::format("--data: {} holds IDX image files: --model gpt trains on llm.c token shards", c.data.dir));
  require(c.data.format != DataFormat::kNpy || !c.lm.has_value(),
          fmt::format("--data: {} holds NumPy arrays: --model gpt trains on llm.c token shards", c.data.dir));
}

}  // namespace

namespace {

// Note [Pipeline schedules] (pipeline/schedule.h): what --pipeline-stages needs, and what it is
// not (yet) combined with, each one line.
void check_pipeline(const TrainConfig& c, const cxxopts::ParseResult& r) {
  const PipelineSettings& p = c.pipeline;
  require(p.stages > 1 || (r.count("micro-batches") == 0 && r.count("pipeline-split") == 0 &&
                           r.count("pipeline-schedule") == 0),
          "--micro-batches, --pipeline-schedule and --pipeline-split: need --pipeline-stages > 1");
  if (p.stages == 1) return;
  require(p.micro_batches >= p.stages,
          fmt::format("--micro-batches {} is fewer than --pipeline-stages {}: every stage needs a micro-batch in flight "
                      "(use --micro-batches >= {})",
                      p.micro_batches, p.stages, p.stages));
  require(micro_batch_problem(p.stages, p.micro_batches).empty(),
          fmt::format("--micro-batches: {}", micro_batch_problem(p.stages, p.micro_batches)));
  require(c.batch_size % p.micro_batches == 0,
          fmt::format("--batch-size {} is not a multiple of --micro-batches {} (every micro-batch has the same rows)",
                      c.batch_size, p.micro_batches));
  require(p.split.empty() || p.split.size() + 1 == static_cast<size_t>(p.stages),
          fmt::format("--pipeline-split names {} cut(s) but --pipeline-stages {} needs {}", p.split.size(), p.stages,
                      p.stages - 1));
  const auto not_yet = [&](bool used, const std::string& what) {
    require(!used, fmt::format("--pipeline-stages {}: not yet with {}", p.stages, what));
  };
  not_yet(c.runtime.device.str().rfind("cuda", 0) == 0 && c.ddp.zero_stage > 0, kPipelineZeroOnGpu);
  // --zero 1 shards each stage's optimizer state, in checkpoints too, and --zero 2 reduce-scatters
  // its gradients (Note [Pipeline ZeRO-1]), the GPT's and with --clip-grad-norm too.
  // Note [Pipeline BatchNorm]: resnet18 trains and checkpoints (its running statistics are in the
  // unsplit model's tensor list), with --sync-bn over a stage's replicas.
  // A stage sums its gradients over its replicas itself (PipelineStage, one all-reduce per
  // parameter as it is final) and broadcasts its BatchNorm buffers itself (Note [Pipeline
  // BatchNorm]): DDP's settings would be ignored, so they are refused rather than accepted and
  // dropped.
  for (const char* ddp_flag : {"comm-hook", "bucket-cap-mb", "find-unused-parameters", "broadcast-buffers"})
    not_yet(r.count(ddp_flag) > 0, fmt::format("--{} (a stage sums its gradients itself, without DDP's buckets)",
                                                ddp_flag));
}

}  // namespace

ParsedTrain parse_train_options(const std::vector<std::string>& args) {
  cxxopts::Options options = make_train_options();
  const ParsedFlags flags = parse_flags(options, args);
  ParsedTrain out;
  if (flags.help) {
    out.help = true;
    out.help_text = flags.help_text;
    return out;
  }
  const cxxopts::ParseResult& r = flags.result;
  for (auto read : {read_data, read_model, read_optimisation, read_class_weights, read_distributed, read_device,
                    read_checkpoints, read_output, read_lm})
    read(r, out.config);
  detect_format(out.config);
  const TrainConfig& c = out.config;
  // After read_lm: --model gpt's optimizer is AdamW unless the flag says otherwise.
  require(r.count("beta2") == 0 || c.optimizer.kind == OptimizerKind::kAdamW, "--beta2: only with --optimizer adamw");
  // Join shadows whole optimizer steps, and a checkpoint inside an uneven epoch has no single
  // sample position to resume from.
  require(c.data.sampler != SamplerTail::kUneven || !c.ddp.sync_batchnorm,
          "--sync-bn: not with --sampler uneven (a rank out of data runs no forward; the others would wait for it in "
          "SyncBatchNorm's all-gather)");
  // As --width: a flag the model has nothing for is refused, not ignored (mlp, cnn and gpt have no BatchNorm).
  require(!c.ddp.sync_batchnorm || (!c.lm && c.model.kind == ModelKind::kResnet18),
          fmt::format("--sync-bn: only with --model resnet18 (the model with BatchNorm), got --model {}",
                      c.lm ? "gpt" : model_kind_name(c.model.kind)));
  require(c.data.sampler != SamplerTail::kUneven || c.accumulate == 1,
          fmt::format("--sampler uneven: needs --accumulate 1, got {}", c.accumulate));
  require(c.data.sampler != SamplerTail::kUneven || c.checkpoints.every == 0,
          fmt::format("--sampler uneven: checkpoints are saved at epoch ends only (--checkpoint-every 0), got {}",
                      c.checkpoints.every));
  check_pipeline(c, r);
  return out;
}

std::vector<float> check_class_weights(const TrainConfig& c, int64_t classes, const char* what) {
  if (!c.class_weights.empty() && static_cast<int64_t>(c.class_weights.size()) != classes)
    throw UsageError(fmt::format("--class-weights: {} weights for the {} {} (one weight per class)",
                                 c.class_weights.size(), classes, what));
  return c.class_weights;
}

RuntimeOptions parse_runtime_flags(const std::string& device, int threads) {
  cxxopts::Options options = make_train_options();
  const ParsedFlags flags = parse_flags(options, {"--device", device, "--threads", std::to_string(threads)});
  TrainConfig c;
  read_device(flags.result, c);
  return c.runtime;
}

}  // namespace dtrain
