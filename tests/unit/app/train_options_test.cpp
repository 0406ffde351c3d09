// `dtrain train` flags: defaults are the seeds' job, and every wrong flag or value is a
// one-line UsageError naming the flag.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "core/error.h"
#include "app/train_options.h"

namespace dtrain {
namespace {

std::string usage_error_of(std::vector<std::string> args) {
  try {
    parse_train_options(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(TrainOptions, DefaultsAreTheSeedsReferenceJob) {
  TrainConfig c = parse_train_options({"--data", "/tmp"}).config;
  EXPECT_EQ(c.model.kind, ModelKind::kMlp);
  EXPECT_EQ(c.model.hidden, (std::vector<int64_t>{256}));
  EXPECT_EQ(c.batch_size, 64);
  EXPECT_EQ(c.optimizer.kind, OptimizerKind::kSgd);
  EXPECT_FLOAT_EQ(c.optimizer.lr, 0.01f);
  EXPECT_FLOAT_EQ(c.optimizer.momentum, 0.9f);
  EXPECT_EQ(c.runtime.device, DeviceRequest::automatic());
  EXPECT_EQ(c.epochs, 1);
  EXPECT_EQ(c.ddp.bucket_cap_bytes, size_t{25} << 20);
}

TEST(TrainOptions, ParsesEveryGroup) {
  TrainConfig c = parse_train_options({"--data", "/tmp", "--model", "mlp", "--hidden", "1024,512", "--epochs", "3",
                                       "--batch-size", "128", "--optimizer", "adamw", "--lr", "0.001",
                                       "--weight-decay", "0.05", "--lr-schedule", "cosine", "--device", "cpu",
                                       "--comm-hook", "bf16", "--bucket-cap-mb", "4", "--find-unused-parameters",
                                       "--accumulate", "2", "--normalize", "0.286,0.353", "--trace", "t.json"})
                      .config;
  EXPECT_EQ(c.model.hidden, (std::vector<int64_t>{1024, 512}));
  EXPECT_EQ(c.epochs, 3);
  EXPECT_EQ(c.batch_size, 128);
  EXPECT_EQ(c.optimizer.kind, OptimizerKind::kAdamW);
  EXPECT_FLOAT_EQ(c.optimizer.lr, 0.001f);
  EXPECT_FLOAT_EQ(c.optimizer.weight_decay, 0.05f);
  EXPECT_EQ(c.lr_schedule, LrSchedule::Kind::kCosine);
  EXPECT_EQ(c.runtime.device, DeviceRequest::cpu());
  EXPECT_EQ(c.ddp.comm_hook, CommHookKind::kBf16);
  EXPECT_EQ(c.ddp.bucket_cap_bytes, size_t{4} << 20);
  EXPECT_TRUE(c.ddp.find_unused_parameters);
  EXPECT_EQ(c.accumulate, 2);
  EXPECT_FLOAT_EQ(c.data.normalize.mean, 0.286f);
  EXPECT_FLOAT_EQ(c.data.normalize.std, 0.353f);
  EXPECT_EQ(c.output.trace_path, "t.json");
}

// NCCL's timing events cost every collective something: asked for only by --trace and --metrics
// (RuntimeOptions::device_timing, passed on as NcclOptions::device_timing).
TEST(TrainOptions, DeviceTimingOnlyWhenTraceOrMetricsAskForIt) {
  EXPECT_FALSE(parse_train_options({"--data", "/tmp"}).config.runtime.device_timing);
  EXPECT_TRUE(parse_train_options({"--data", "/tmp", "--trace", "t.json"}).config.runtime.device_timing);
  EXPECT_TRUE(parse_train_options({"--data", "/tmp", "--metrics", "m.csv"}).config.runtime.device_timing);
}

TEST(TrainOptions, WrongFlagsAndValuesAreOneLineUsageErrors) {
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--batch-size", "0"}), "--batch-size: must be at least 1, got 0");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--lr", "-0.1"}), "--lr: must be positive, got -0.1");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--model", "resnet"}),
            "--model: expected mlp, cnn, resnet18 or gpt, got 'resnet'");
  EXPECT_EQ(usage_error_of({"--data", "/nonexistent/dir"}),
            "--data: no such directory '/nonexistent/dir' (Debian: apt-get install dataset-fashion-mnist)");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--hidden", "256,x"}),
            "--hidden: expected positive widths like 256 or 1024,1024, got '256,x'");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--optimizer", "lbfgs"}), "--optimizer: expected sgd or adamw, got 'lbfgs'");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--comm-hook", "int8"}),
            "--comm-hook: expected allreduce, bf16 or fp16, got 'int8'");
  EXPECT_NE(usage_error_of({"--data", "/tmp", "--no-such-flag"}).find("no-such-flag"), std::string::npos);
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--epochs", "two"}), "--epochs: expected a number, got 'two'");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--lr=abc"}), "--lr: expected a number, got 'abc'");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--threads", "1.5"}), "--threads: expected a whole number, got '1.5'");
  EXPECT_NE(usage_error_of({"--data", "/tmp", "stray"}).find("stray"), std::string::npos);
  for (const std::string& e : {usage_error_of({"--data", "/tmp", "--epochs", "two"}),
                               usage_error_of({"--data", "/tmp", "--no-such-flag"})})
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

// Issue 19 item 13: a float flag's whole value is the number ("0.5abc" used to train at 0.5), and a
// non-finite one is named as such (not "expected a whole number").
// --memory-per-rank: the budget the model's memory check honours (Note [Stage construction]).
TEST(TrainOptions, MemoryPerRankIsASize) {
  EXPECT_EQ(parse_train_options({"--data", "/tmp", "--memory-per-rank", "3G"}).config.model.memory_budget_bytes,
            int64_t{3} << 30);
  EXPECT_EQ(parse_train_options({"--data", "/tmp", "--memory-per-rank", "512M"}).config.model.memory_budget_bytes,
            int64_t{512} << 20);
  EXPECT_EQ(parse_train_options({"--data", "/tmp"}).config.model.memory_budget_bytes, 0);
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--memory-per-rank", "2X"}),
            "--memory-per-rank: expected a size from 1 to 1048576G bytes like 8, 64K or 256M, got '2X'");
}

// What the pipeline does not handle yet is refused in one line; resnet18 with its checkpoints and
// --sync-bn are accepted.
TEST(TrainOptions, PipelineRefusesWhatItCannotTrainYet) {
  const std::vector<std::string> p2 = {"--data", "/tmp", "--pipeline-stages", "2"};
  const auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> args = p2;
    args.insert(args.end(), more.begin(), more.end());
    return usage_error_of(args);
  };
  // resnet18 trains and checkpoints its running statistics (Note [Pipeline BatchNorm]), with
  // --sync-bn over a stage's replicas (Note [Pipeline SyncBatchNorm]).
  EXPECT_EQ(with({"--model", "resnet18"}), "<no error>");
  EXPECT_EQ(with({"--model", "resnet18", "--sync-bn"}), "<no error>");
  EXPECT_EQ(with({"--model", "resnet18", "--checkpoint-dir", "ck"}), "<no error>");
  EXPECT_EQ(with({"--model", "resnet18", "--init-weights", "w.safetensors"}), "<no error>");
  EXPECT_EQ(with({"--model", "resnet18", "--checkpoint-dir", "ck", "--resume", "auto"}), "<no error>");
  EXPECT_TRUE(with({"--model", "resnet18", "--sync-bn", "--sampler", "uneven"})
                  .starts_with("--sync-bn: not with --sampler uneven"));
  // The weighted mean over the global batch (Note [Pipeline class weights]), the GPT's per token id.
  EXPECT_EQ(with({"--class-weights", "1,2,1,1,1,1,1,1,1,1"}), "<no error>");
  EXPECT_EQ(with({"--model", "gpt", "--batch-size", "8", "--class-weights", "1,2"}), "<no error>");
  // Uneven inputs: a replica out of full batches runs joined steps (Note [Pipeline Join]); as
  // without the pipeline, saved at epoch ends only.
  EXPECT_EQ(with({"--sampler", "uneven", "--checkpoint-dir", "ck", "--zero", "2", "--class-weights", "1,2,1,1,1,1,1,1,1,1"}),
            "<no error>");
  EXPECT_EQ(with({"--sampler", "uneven", "--checkpoint-dir", "ck", "--checkpoint-every", "5"}),
            "--sampler uneven: checkpoints are saved at epoch ends only (--checkpoint-every 0), got 5");
  EXPECT_EQ(with({"--micro-batches", "1"}),
            "--micro-batches 1 is fewer than --pipeline-stages 2: every stage needs a micro-batch in flight (use "
            "--micro-batches >= 2)");
  // The GPT trains through the pipeline (clipping, checkpoints, --init-weights and --accumulate
  // included).
  EXPECT_EQ(with({"--model", "gpt", "--batch-size", "8", "--clip-grad-norm", "1"}), "<no error>");
  EXPECT_EQ(with({"--model", "gpt", "--batch-size", "8", "--init-weights", "w.safetensors"}), "<no error>");
  EXPECT_EQ(with({"--model", "gpt", "--batch-size", "8", "--checkpoint-dir", "ckpt", "--checkpoint-every", "5",
                  "--resume", "auto"}),
            "<no error>");
  // The image models clip over every stage and, as the GPT, scale the loss through the stages (issue 23).
  EXPECT_EQ(with({"--clip-grad-norm", "1"}), "<no error>");
  EXPECT_EQ(with({"--amp", "fp16"}), "<no error>");
  EXPECT_EQ(with({"--amp", "bf16", "--clip-grad-norm", "1"}), "<no error>");
  EXPECT_EQ(with({"--model", "gpt", "--batch-size", "8", "--amp", "fp16"}), "<no error>");
  // --zero 1 shards a stage's optimizer state over its replicas, in checkpoints too, the GPT's
  // included; --zero 2 also reduce-scatters an image-model stage's gradients.
  EXPECT_EQ(with({"--zero", "1"}), "<no error>");
  EXPECT_EQ(with({"--zero", "2", "--checkpoint-dir", "ck", "--amp", "fp16"}), "<no error>");
  // --zero 2 with the GPT's tied wte and with clipping (Note [Pipeline ZeRO-1]).
  EXPECT_EQ(with({"--model", "gpt", "--batch-size", "8", "--zero", "2"}), "<no error>");
  EXPECT_EQ(with({"--zero", "2", "--clip-grad-norm", "1"}), "<no error>");
  EXPECT_EQ(with({"--model", "gpt", "--batch-size", "8", "--zero", "2", "--clip-grad-norm", "1"}), "<no error>");
  EXPECT_EQ(with({"--model", "gpt", "--batch-size", "8", "--zero", "1"}), "<no error>");
  EXPECT_EQ(with({"--zero", "1", "--checkpoint-dir", "ck", "--resume", "auto"}), "<no error>");
  EXPECT_EQ(with({"--model", "gpt", "--batch-size", "8", "--zero", "1", "--checkpoint-dir", "ck"}), "<no error>");
  EXPECT_EQ(with({"--model", "gpt", "--batch-size", "8", "--accumulate", "2"}), "<no error>");
  EXPECT_EQ(with({"--accumulate", "2"}), "<no error>");  // the image pipeline's too
  // A GPU (Note [Pipeline on a GPU] in pipeline/grid.h), without --zero only.
  EXPECT_EQ(with({"--device", "cuda"}), "<no error>");
  EXPECT_EQ(with({"--device", "cuda:0", "--model", "gpt", "--batch-size", "8"}), "<no error>");
  EXPECT_EQ(with({"--device", "cuda", "--zero", "1"}),
            "--pipeline-stages 2: not yet with --zero on a GPU (only on --device cpu so far)");
  // DDP's own settings would be dropped by a stage, which sums its gradients itself.
  for (const std::vector<std::string>& more : std::vector<std::vector<std::string>>{
           {"--comm-hook", "bf16"}, {"--bucket-cap-mb", "4"}, {"--find-unused-parameters"}, {"--broadcast-buffers", "off"}})
    EXPECT_EQ(with(more), fmt::format("--pipeline-stages 2: not yet with {} (a stage sums its gradients itself, "
                                      "without DDP's buckets)", more[0]));
  // The progress line (the last stage's replica 0 draws it) and dropout (the unsplit model's masks:
  // Note [Pipeline dropout]) train, and resume (each stage takes its Dropout counters back).
  EXPECT_EQ(with({"--progress", "on"}), "<no error>");
  EXPECT_EQ(with({"--model", "gpt", "--batch-size", "8", "--progress", "on"}), "<no error>");
  EXPECT_EQ(with({"--dropout", "0.3"}), "<no error>");
  EXPECT_EQ(with({"--dropout", "0.3", "--checkpoint-dir", "ck"}), "<no error>");
  EXPECT_EQ(with({"--dropout", "0.3", "--checkpoint-dir", "ck", "--resume", "auto"}), "<no error>");
}

TEST(TrainOptions, FloatFlagsAreParsedStrictly) {
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--lr", "0.5abc"}), "--lr: expected a number, got '0.5abc'");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--lr", "nan"}), "--lr: expected a finite number, got 'nan'");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--lr=inf"}), "--lr: expected a finite number, got 'inf'");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--lr", "1e39"}), "--lr: '1e39' is out of range for a number");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--lr", ""}), "--lr: expected a number, got ''");
  for (const char* flag : {"--dropout", "--momentum", "--weight-decay", "--adam-eps", "--lr-gamma", "--timeout"}) {
    EXPECT_EQ(usage_error_of({"--data", "/tmp", flag, "0.1x"}), std::string(flag) + ": expected a number, got '0.1x'");
    EXPECT_EQ(usage_error_of({"--data", "/tmp", flag, "nan"}), std::string(flag) + ": expected a finite number, got 'nan'");
  }
  // Integer flags already refused trailing garbage (cxxopts matches the whole text): kept so.
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--epochs", "2abc"}), "--epochs: expected a number, got '2abc'");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--threads", "nan"}), "--threads: expected a whole number, got 'nan'");
  // Each thread is started up front (core/cpu_workers.h): a typo'd count is a usage error.
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--threads", "100000"}),
            "--threads: must be in [0, 4096] (0: the rank's share of the cores), got 100000");
  const TrainConfig c = parse_train_options({"--data", "/tmp", "--lr", "+5e-1", "--timeout", "1.5", "--lr-gamma", "1"}).config;
  EXPECT_FLOAT_EQ(c.optimizer.lr, 0.5f);
  EXPECT_EQ(c.runtime.collective_timeout_s, 1.5);
  EXPECT_FLOAT_EQ(c.lr_gamma, 1.f);
}

TEST(TrainOptions, ClassesAreCountedFromTheLabelsUnlessGiven) {
  EXPECT_EQ(parse_train_options({"--data", "/tmp"}).config.data.classes, 0);
  EXPECT_EQ(parse_train_options({"--data", "/tmp", "--classes", "12"}).config.data.classes, 12);
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--classes", "-1"}),
            "--classes: must be in [0, 1000000] (0: from the labels), got -1");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--classes", "1000001"}),
            "--classes: must be in [0, 1000000] (0: from the labels), got 1000001");
}

// Sizes that would wrap the trainer's element counts (the heap overflow and Linear
// overflow) are refused at the flag, before anything is allocated.
TEST(TrainOptions, SizeFlagsHaveSaneUpperBounds) {
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--batch-size", "4611686018427387905"}),
            "--batch-size: must be at most 1048576, got 4611686018427387905");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--accumulate", "99999999999"}),
            "--accumulate: must be at most 1048576, got 99999999999");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--hidden", "4611686018427387904"}),
            "--hidden: widths must be at most 1048576, got 4611686018427387904");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--hidden", "256,1048577"}),
            "--hidden: widths must be at most 1048576, got 1048577");
  EXPECT_EQ(parse_train_options({"--data", "/tmp", "--batch-size", "1048576", "--hidden", "1048576"}).config.batch_size,
            1048576);
}

TEST(TrainOptions, BucketCapIsMiBOrAuto) {
  const TrainConfig fixed = parse_train_options({"--data", "/tmp", "--bucket-cap-mb", "0.5"}).config;
  EXPECT_FALSE(fixed.ddp.bucket_cap_auto);
  EXPECT_EQ(fixed.ddp.bucket_cap_bytes, size_t{1} << 19);
  EXPECT_TRUE(parse_train_options({"--data", "/tmp", "--bucket-cap-mb", "auto"}).config.ddp.bucket_cap_auto);
  EXPECT_FALSE(parse_train_options({"--data", "/tmp"}).config.ddp.bucket_cap_auto);
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--bucket-cap-mb", "fast"}),
            "--bucket-cap-mb: must be auto or a number in (0, 1e6], got 'fast'");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--bucket-cap-mb", "0"}),
            "--bucket-cap-mb: must be auto or a number in (0, 1e6], got '0'");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--bucket-cap-mb", "25MB"}),
            "--bucket-cap-mb: must be auto or a number in (0, 1e6], got '25MB'");
}

TEST(TrainOptions, AmpIsOffUnlessBf16IsAsked) {
  EXPECT_EQ(parse_train_options({"--data", "/tmp"}).config.amp, AmpMode::kOff);
  EXPECT_EQ(parse_train_options({"--data", "/tmp", "--amp", "off"}).config.amp, AmpMode::kOff);
  EXPECT_EQ(parse_train_options({"--data", "/tmp", "--amp", "bf16"}).config.amp, AmpMode::kBf16);
  EXPECT_EQ(parse_train_options({"--data", "/tmp", "--amp", "bf16", "--device", "cpu"}).config.amp, AmpMode::kBf16);
  EXPECT_EQ(parse_train_options({"--data", "/tmp", "--amp", "fp16"}).config.amp, AmpMode::kFp16);
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--amp", "BF16"}), "--amp: expected off, bf16 or fp16, got 'BF16'");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--amp", ""}), "--amp: expected off, bf16 or fp16, got ''");
}

TEST(TrainOptions, LossScaleIsForFp16Only) {
  const TrainConfig dyn = parse_train_options({"--data", "/tmp", "--amp", "fp16"}).config;
  EXPECT_TRUE(dyn.loss_scale.dynamic);
  EXPECT_EQ(dyn.loss_scale.init_scale, 65536.f);
  EXPECT_EQ(dyn.loss_scale.growth_interval, 2000);
  const TrainConfig fixed = parse_train_options({"--data", "/tmp", "--amp", "fp16", "--loss-scale", "128"}).config;
  EXPECT_FALSE(fixed.loss_scale.dynamic);
  EXPECT_EQ(fixed.loss_scale.init_scale, 128.f);
  EXPECT_EQ(parse_train_options({"--data", "/tmp", "--amp", "fp16", "--loss-scale-growth-interval", "3"})
                .config.loss_scale.growth_interval,
            3);
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--loss-scale", "128"}),
            "--loss-scale and --loss-scale-growth-interval: need --amp fp16 (got --amp off)");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--amp", "bf16", "--loss-scale-growth-interval", "5"}),
            "--loss-scale and --loss-scale-growth-interval: need --amp fp16 (got --amp bf16)");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--amp", "fp16", "--loss-scale", "0"}),
            "--loss-scale: expected dynamic or a positive scale, got '0'");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--amp", "fp16", "--loss-scale", "big"}),
            "--loss-scale: expected a number, got 'big'");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--amp", "fp16", "--loss-scale-growth-interval", "0"}),
            "--loss-scale-growth-interval: must be in [1, 1000000000], got 0");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--amp", "fp16", "--loss-scale", "8", "--loss-scale-growth-interval", "9"}),
            "--loss-scale-growth-interval: needs a dynamic --loss-scale (a fixed scale never grows)");
  EXPECT_EQ(parse_train_options({"--model", "gpt", "--data", "/tmp", "--amp", "fp16"}).config.amp, AmpMode::kFp16);
}

TEST(TrainOptions, HelpListsEveryFlag) {
  ParsedTrain p = parse_train_options({"--help"});
  ASSERT_TRUE(p.help);
  for (const char* flag : {"--data", "--model", "--hidden", "--epochs", "--batch-size", "--lr", "--momentum",
                           "--optimizer", "--weight-decay", "--seed", "--device", "--log-interval", "--bucket-cap-mb",
                           "--find-unused-parameters", "--trace", "--comm-hook", "--allow-gpu-sharing", "--tf32", "--amp", "--loss-scale"})
    EXPECT_NE(p.help_text.find(flag), std::string::npos) << flag;
}

}  // namespace
}  // namespace dtrain

namespace dtrain {
namespace {

TEST(TrainOptions, WatchdogFlagsTurnTheMachineryOffAndTheHeaderCheckOn) {
  const TrainConfig d = parse_train_options({"--data", "/tmp"}).config;
  EXPECT_EQ(d.runtime.collective_timeout_s, 600);
  EXPECT_EQ(d.runtime.flight_recorder_size, 2000u);
  EXPECT_FALSE(d.runtime.debug_collectives);
  const TrainConfig off =
      parse_train_options({"--data", "/tmp", "--timeout", "0", "--flight-recorder-size", "0", "--debug-collectives"}).config;
  EXPECT_EQ(off.runtime.collective_timeout_s, 0);
  EXPECT_EQ(off.runtime.flight_recorder_size, 0u);
  EXPECT_TRUE(off.runtime.debug_collectives);
  EXPECT_THROW(parse_train_options({"--data", "/tmp", "--flight-recorder-size", "-1"}), UsageError);
}

}  // namespace
}  // namespace dtrain

namespace dtrain {
namespace {

std::string lm_error_of(std::vector<std::string> args) {
  args.insert(args.begin(), {"--model", "gpt", "--data", "/tmp"});
  try {
    parse_train_options(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "<no error>";
}

// --model gpt: the shared contract's flags, and the defaults GPT users expect where not given.
TEST(TrainOptions, GptFlagsAndDefaults) {
  const TrainConfig d = parse_train_options({"--model", "gpt", "--data", "/tmp"}).config;
  ASSERT_TRUE(d.lm.has_value());
  EXPECT_EQ(d.lm->layers, 4);
  EXPECT_EQ(d.lm->heads, 4);
  EXPECT_EQ(d.lm->embd, 256);
  EXPECT_EQ(d.lm->context, 256);
  EXPECT_EQ(d.lm->vocab, 0);
  EXPECT_EQ(d.lm->steps, 500);
  EXPECT_EQ(d.lm->eval_every, 0);
  EXPECT_EQ(d.lm->eval_batches, 20);
  EXPECT_EQ(d.batch_size, 8);
  EXPECT_EQ(d.optimizer.kind, OptimizerKind::kAdamW);
  EXPECT_FLOAT_EQ(d.optimizer.lr, 1e-3f);
  EXPECT_FLOAT_EQ(d.optimizer.beta2, 0.999f);
  EXPECT_TRUE(d.optimizer.decay_matrices_only);
  EXPECT_FLOAT_EQ(d.min_lr, 1e-4f);
  EXPECT_EQ(d.warmup_steps, 0);
  EXPECT_EQ(d.clip_grad_norm, 0.f);
  EXPECT_EQ(d.lr_schedule, LrSchedule::Kind::kConstant);
  EXPECT_EQ(d.data.format, DataFormat::kAuto);

  const TrainConfig c =
      parse_train_options({"--model", "gpt", "--data", "/tmp", "--layers", "1", "--heads", "2", "--embd", "16",
                           "--context", "16", "--vocab", "256", "--steps", "50", "--warmup-steps", "10",
                           "--lr-schedule", "cosine", "--lr", "3e-3", "--min-lr", "0", "--beta2", "0.95",
                           "--weight-decay", "0.1", "--clip-grad-norm", "1", "--eval-every", "5", "--eval-batches",
                           "4", "--batch-size", "2", "--data-format", "llmc", "--shuffle", "off", "--progress", "on"})
          .config;
  EXPECT_EQ(c.lm->layers, 1);
  EXPECT_EQ(c.lm->heads, 2);
  EXPECT_EQ(c.lm->embd, 16);
  EXPECT_EQ(c.lm->context, 16);
  EXPECT_EQ(c.lm->vocab, 256);
  EXPECT_EQ(c.lm->steps, 50);
  EXPECT_EQ(c.warmup_steps, 10);
  EXPECT_EQ(c.lr_schedule, LrSchedule::Kind::kCosine);
  EXPECT_FLOAT_EQ(c.optimizer.lr, 3e-3f);
  EXPECT_EQ(c.min_lr, 0.f);
  EXPECT_FLOAT_EQ(c.optimizer.beta2, 0.95f);
  EXPECT_FLOAT_EQ(c.optimizer.weight_decay, 0.1f);
  EXPECT_FLOAT_EQ(c.clip_grad_norm, 1.f);
  EXPECT_EQ(c.lm->eval_every, 5);
  EXPECT_EQ(c.lm->eval_batches, 4);
  EXPECT_EQ(c.batch_size, 2);
  EXPECT_EQ(c.data.format, DataFormat::kLlmc);
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_EQ(c.output.progress, ProgressMode::kOn);  // the step progress line, as images' epoch line
  // Image models: unchanged defaults; clipping and beta2 are theirs too.
  const TrainConfig mlp = parse_train_options({"--data", "/tmp", "--optimizer", "adamw", "--beta2", "0.98",
                                               "--clip-grad-norm", "0.5"})
                              .config;
  EXPECT_FALSE(mlp.lm.has_value());
  EXPECT_FLOAT_EQ(mlp.optimizer.beta2, 0.98f);
  EXPECT_FALSE(mlp.optimizer.decay_matrices_only);
  EXPECT_FLOAT_EQ(mlp.clip_grad_norm, 0.5f);
}

TEST(TrainOptions, GptWrongValuesAndMisplacedFlagsAreOneLineUsageErrors) {
  EXPECT_EQ(lm_error_of({"--heads", "3"}), "--heads: must divide --embd 256 (each head takes embd / heads), got 3");
  EXPECT_EQ(lm_error_of({"--layers", "0"}), "--layers: must be in [1, 10000], got 0");
  EXPECT_EQ(lm_error_of({"--context", "0"}), "--context: must be in [1, 1048576], got 0");
  EXPECT_EQ(lm_error_of({"--vocab", "-1"}), "--vocab: must be in [0, 1048576] (0: from the data), got -1");
  EXPECT_EQ(lm_error_of({"--steps", "0"}), "--steps: must be at least 1, got 0");
  EXPECT_EQ(lm_error_of({"--eval-every", "-1"}), "--eval-every: must be non-negative (0: at the end only), got -1");
  EXPECT_EQ(lm_error_of({"--eval-batches", "0"}), "--eval-batches: must be at least 1, got 0");
  EXPECT_EQ(lm_error_of({"--steps", "5", "--warmup-steps", "6"}), "--warmup-steps: must be in [0, --steps 5], got 6");
  EXPECT_EQ(lm_error_of({"--min-lr", "0.1"}), "--min-lr: must be in [0, --lr 0.001], got 0.1");
  EXPECT_EQ(lm_error_of({"--beta2", "1"}), "--beta2: must be in [0, 1), got 1");
  EXPECT_EQ(lm_error_of({"--clip-grad-norm", "-1"}), "--clip-grad-norm: must be non-negative (0: off), got -1");
  EXPECT_EQ(lm_error_of({"--lr-schedule", "step"}), "--lr-schedule step: --model gpt takes none or cosine (per step)");
  EXPECT_EQ(lm_error_of({"--epochs", "2"}), "--epochs: not with --model gpt (language models train --steps)");
  EXPECT_EQ(lm_error_of({"--hidden", "64"}), "--hidden: not with --model gpt (an image-model flag)");
  EXPECT_EQ(lm_error_of({"--data-format", "idx"}), "--data-format idx: --model gpt trains on token shards (llmc)");
  EXPECT_EQ(lm_error_of({"--data-format", "npy"}), "--data-format npy: --model gpt trains on token shards (llmc)");
  EXPECT_EQ(lm_error_of({"--data-format", "csv"}), "--data-format: expected auto, idx, npy or llmc, got 'csv'");
  EXPECT_EQ(lm_error_of({"--optimizer", "sgd", "--beta2", "0.95"}), "--beta2: only with --optimizer adamw");
  EXPECT_EQ(usage_error_of({"--model", "gpt"}).substr(0, 34), "--data: --model gpt needs --data D");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--steps", "10"}), "--steps: only with --model gpt");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--layers", "2"}), "--layers: only with --model gpt");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--data-format", "llmc"}),
            "--data-format llmc: token shards train --model gpt");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--beta2", "0.95"}), "--beta2: only with --optimizer adamw");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--model", "rnn"}),
            "--model: expected mlp, cnn, resnet18 or gpt, got 'rnn'");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--width", "8"}), "--width: only with --model resnet18");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--model", "cnn", "--sync-bn"}),
            "--sync-bn: only with --model resnet18 (the model with BatchNorm), got --model cnn");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--model", "gpt", "--sync-bn"}),
            "--sync-bn: only with --model resnet18 (the model with BatchNorm), got --model gpt");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--model", "resnet18", "--width", "0"}),
            "--width: must be in [1, 4096], got 0");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--model", "resnet18", "--dropout", "0.1"}),
            "--dropout: not with --model resnet18 (its layers are torchvision's; --width sets its size)");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--broadcast-buffers", "yes"}),
            "--broadcast-buffers: expected on or off, got 'yes'");
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--sync-bn", "--sampler", "uneven"}),
            "--sync-bn: not with --sampler uneven (a rank out of data runs no forward; the others would wait for it "
            "in SyncBatchNorm's all-gather)");
}

// --data-format auto detects what --data holds: token shards with an image model, or IDX files
// with --model gpt, are one usage line each (not a loader failure later).
TEST(TrainOptions, AutoDataFormatDetectsAndRefusesTheWrongModel) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / fmt::format("dtrain_format_{}", ::getpid());
  fs::create_directories(root / "shards");
  fs::create_directories(root / "idx");
  fs::create_directories(root / "npy");
  {
    std::ofstream(root / "npy" / "train.npz") << "x";
    std::ofstream shard(root / "shards" / "tiny_train_000000.bin", std::ios::binary);
    const int32_t header[3] = {20240520, 1, 0};
    shard.write(reinterpret_cast<const char*>(header), sizeof header);
    std::ofstream(root / "idx" / "train-images-idx3-ubyte") << "x";
  }
  const std::string shards = (root / "shards").string(), idx = (root / "idx").string();
  EXPECT_EQ(usage_error_of({"--data", shards}), fmt::format("--data: {} holds llm.c token shards: use --model gpt", shards));
  EXPECT_EQ(usage_error_of({"--data", idx, "--model", "gpt"}),
            fmt::format("--data: {} holds IDX image files: --model gpt trains on llm.c token shards", idx));
  EXPECT_EQ(parse_train_options({"--data", shards, "--model", "gpt"}).config.data.format, DataFormat::kLlmc);
  EXPECT_EQ(parse_train_options({"--data", idx}).config.data.format, DataFormat::kIdx);
  const std::string npy = (root / "npy").string();
  EXPECT_EQ(usage_error_of({"--data", npy, "--model", "gpt"}),
            fmt::format("--data: {} holds NumPy arrays: --model gpt trains on llm.c token shards", npy));
  EXPECT_EQ(parse_train_options({"--data", npy, "--model", "cnn"}).config.data.format, DataFormat::kNpy);
  fs::remove_all(root);
}

}  // namespace
}  // namespace dtrain

namespace dtrain {
namespace {

// Note [ZeRO shards]: --zero is 0, 1 or 2, and combines with autotuning and the compression hooks.
TEST(TrainOptions, ZeroStagesAndTheirCombinations) {
  EXPECT_EQ(parse_train_options({"--data", "/tmp"}).config.ddp.zero_stage, 0);
  EXPECT_EQ(parse_train_options({"--data", "/tmp", "--zero", "2"}).config.ddp.zero_stage, 2);
  EXPECT_EQ(usage_error_of({"--data", "/tmp", "--zero", "3"}), "--zero: expected 0, 1 or 2, got 3");
  EXPECT_EQ(parse_train_options({"--data", "/tmp", "--zero", "1", "--comm-hook", "bf16"}).config.ddp.zero_stage, 1);
  // Checkpoints of sharded state are written and read at any world size and --zero.
  EXPECT_EQ(parse_train_options({"--data", "/tmp", "--zero", "2", "--checkpoint-dir", "/tmp/x", "--resume", "auto"})
                .config.ddp.zero_stage,
            2);
  // --bucket-cap-mb auto re-cuts the shards (Note [Re-cutting sharded state]).
  EXPECT_TRUE(parse_train_options({"--data", "/tmp", "--zero", "2", "--bucket-cap-mb", "auto"}).config.ddp.bucket_cap_auto);
  // --comm-hook bf16|fp16 reduce-scatter their 16-bit words (Note [Compressed reduce-scatter]).
  EXPECT_EQ(parse_train_options({"--data", "/tmp", "--zero", "2", "--comm-hook", "fp16"}).config.ddp.comm_hook,
            CommHookKind::kFp16);
}

}  // namespace
}  // namespace dtrain

namespace dtrain {
namespace {

TEST(TrainOptions, ClassWeightsParsedOnceAndTheirCountCheckedAgainstTheData) {
  const TrainConfig c = parse_train_options({"--data", "/tmp", "--class-weights", "1,0.5,+2,0"}).config;
  EXPECT_EQ(c.class_weights, (std::vector<float>{1.f, 0.5f, 2.f, 0.f}));
  EXPECT_EQ(check_class_weights(c, 4, "classes"), c.class_weights);
  EXPECT_TRUE(parse_train_options({"--data", "/tmp"}).config.class_weights.empty());
  EXPECT_TRUE(check_class_weights(TrainConfig{}, 10, "classes").empty());  // unweighted: any count
  try {
    check_class_weights(c, 10, "classes of the training data");
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "--class-weights: 4 weights for the 10 classes of the training data (one weight per class)");
  }
  const auto error = [](const std::string& w) {
    try {
      parse_train_options({"--data", "/tmp", "--class-weights", w});
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error("1,-1"), "--class-weights: each weight must be a finite number >= 0, got -1");
  EXPECT_EQ(error("0,0"), "--class-weights: at least one weight must be positive (all zero weigh every sample 0)");
  EXPECT_EQ(error("1,,2"), "--class-weights: expected numbers like 1,2.5,1, got '1,,2'");
  EXPECT_EQ(error("1,x"), "--class-weights: expected a number, got 'x'");
  EXPECT_EQ(error("1,nan"), "--class-weights: expected a finite number, got 'nan'");
  EXPECT_EQ(error(""), "--class-weights: expected numbers like 1,2.5,1, got ''");
}

}  // namespace
}  // namespace dtrain
