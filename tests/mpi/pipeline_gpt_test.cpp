// The GPT in the pipeline (Note [GPT pipeline stages] in model/gpt.h, Note [Tied stages] in
// pipeline/pipeline_stage.h) at 2, 3 and 4 ranks: every P x D grid the world allows (P = 2 at
// np 2, P = 3 at np 3, P = 2 x D = 2 and P = 4 at np 4) trains a GPT with AdamW (warm-up,
// cosine, weight decay of the matrices, clipping by the global norm) whose weights after N steps
// equal the unsplit Gpt's trained in one process on the same global batch (1e-5 relative, every
// tensor, the last stage's copy of the tied wte included), with the same losses; GPipe equals
// 1F1B bit for bit; the tied weight's two copies stay bitwise equal.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <random>

#include "app/pipeline_zero.h"
#include "comm/exchange.h"
#include "model/gpt.h"
#include "model/grad_clip.h"
#include "model/loss.h"
#include "model/lr_schedule.h"
#include "model/optimizer.h"
#include "pipeline/gpt_stage.h"
#include "pipeline/pipeline_clip.h"
#include "pipeline/pipeline_stage.h"
#include "tests/mpi/collective_test_util.h"
#include "tests/mpi/mpi_test_env.h"
#include "tests/mpi/pipeline_test_util.h"

namespace dtrain {
namespace {

using testing::for_each_replicated_grid;
using testing::pipeline_grids;
using testing::test_comm;
using testing::worst_relative;

constexpr int64_t kRowsPerReplica = 12;  // sequences; a multiple of every M below
constexpr int kSteps = 100;  // the count
constexpr uint64_t kSeed = 11;
constexpr float kClip = 0.5f;  // below the early norms: the clipping acts

GptSpec spec() {
  GptSpec s;
  s.vocab = 40;
  s.context = 8;
  s.layers = 3;  // 5 layers to cut: P = 4 possible
  s.heads = 2;
  s.embd = 16;
  return s;
}

OptimizerSpec adamw() {
  OptimizerSpec o;
  o.kind = OptimizerKind::kAdamW;
  o.lr = 3e-3f;
  o.weight_decay = 0.1f;
  o.beta2 = 0.95f;
  o.eps = 1e-6f;  // tests/e2e/gpt_ddp_test.sh: at 1e-8 the key bias's rounding noise becomes steps
  o.decay_matrices_only = true;
  return o;
}

const StepLrSchedule kSchedule{3e-3f, 3e-4f, /*warmup_steps=*/5, kSteps, /*cosine=*/true};

struct Batch {
  Tensor tokens, targets;  // I32 [rows, T] each
};

// Step `step`'s global batch (replicas x kRowsPerReplica sequences), the same on every rank.
Batch global_batch(int step, int replicas) {
  const int64_t rows = kRowsPerReplica * replicas, T = spec().context;
  std::mt19937 gen(500 + static_cast<uint32_t>(step));
  std::uniform_int_distribution<int> token(0, static_cast<int>(spec().vocab) - 1);
  Batch b{Tensor::empty({rows, T}, Device::cpu(), DType::kI32), Tensor::empty({rows, T}, Device::cpu(), DType::kI32)};
  for (int64_t i = 0; i < rows * T; ++i) {
    b.tokens.data_as<int32_t>()[i] = token(gen);
    b.targets.data_as<int32_t>()[i] = token(gen);
  }
  return b;
}

Batch rows_of(const Batch& b, int64_t first, int64_t count) {
  const int64_t T = spec().context;
  return {b.tokens.slice(first * T, {count, T}), b.targets.slice(first * T, {count, T})};
}

using testing::Weights;

struct Reference {
  Weights weights;
  std::vector<float> losses;
};

Reference train_unsplit(int replicas) {
  Gpt model(spec(), Device::cpu(), kSeed);
  auto opt = make_optimizer(adamw(), model.parameters());
  GradNormClipper clipper(model.parameters());
  CrossEntropyLoss loss;
  Reference ref;
  for (int step = 0; step < kSteps; ++step) {
    const Batch b = global_batch(step, replicas);
    opt->zero_grad();
    const Tensor logits = model.forward(b.tokens);
    ref.losses.push_back(loss_value(loss.forward(logits, b.targets.view({b.targets.numel()}))));
    model.backward(loss.backward());
    clipper.clip(kClip);
    opt->set_lr(static_cast<float>(kSchedule.lr_at(step)));
    opt->step();
  }
  for (Parameter* p : model.parameters()) ref.weights[p->name] = p->value.to_vector();
  return ref;
}

struct PipelineRun {
  Weights weights;  // this stage's (the last stage's wte is its copy)
  std::vector<float> losses;
  std::vector<float> norms;
  uint64_t tied_hash = 0;  // FNV-1a of this stage's wte bytes (0: none here)
};

uint64_t hash_of(const Tensor& t) {
  uint64_t h = 1469598103934665603ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(t.raw());
  for (int64_t i = 0; i < t.numel() * static_cast<int64_t>(sizeof(float)); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  return h;
}

// `zero`: --zero 1 or 2 over each stage's replicas (Note [Pipeline ZeRO-1]), as
// app/lm_pipeline_trainer.cpp.
PipelineRun train_pipeline(PipelineGrid& grid, PipelineSchedule schedule, int micro_batches, int zero = 0) {
  const StageRange range = gpt_stage_ranges(spec(), grid.stages, {})[static_cast<size_t>(grid.stage)];
  PipelineOptions options{schedule, micro_batches, kGptTiedParameter};
  options.sum_gradients = zero != 2;
  std::unique_ptr<Sequential> layers = build_gpt_stage(spec(), Device::cpu(), kSeed, range);
  auto opt = make_optimizer(adamw(), layers->parameters());
  std::optional<StageZero> sharded;
  if (zero > 0) sharded.emplace(*layers, grid, zero == 2);
  PipelineStage stage(std::move(layers), grid, options);
  PipelineClipper clipper(test_comm(), stage);  // as app/lm_pipeline_trainer.cpp
  PipelineRun run;
  for (int step = 0; step < kSteps; ++step) {
    const Batch mine = rows_of(global_batch(step, grid.replicas), grid.replica * kRowsPerReplica, kRowsPerReplica);
    opt->zero_grad();
    float loss = stage.train_step(mine.tokens, mine.targets).loss;
    if (zero == 2) sharded->reduce_scatter_gradients();
    if (grid.stage == grid.stages - 1) grid.data_parallel->allreduce(&loss, 1, DType::kF32, ReduceOp::kAvg);
    run.losses.push_back(loss);
    clipper.clip(kClip);
    run.norms.push_back(clipper.last_norm());
    opt->set_lr(static_cast<float>(kSchedule.lr_at(step)));
    opt->step();
  }
  for (Parameter* p : stage.module().parameters()) {
    run.weights[p->name] = p->value.to_vector();
    if (p->name == kGptTiedParameter) run.tied_hash = hash_of(p->value);
  }
  clipper.shutdown();
  return run;
}

TEST(PipelineGpt, EveryGridsWeightsAfterNAdamWStepsEqualTheUnsplitGptsAndGpipeEquals1f1bBitForBit) {
  for (int stages : pipeline_grids()) {
    PipelineGrid grid = make_pipeline_grid(test_comm(), stages);
    const int M = stages == 4 ? 4 : 6;
    SCOPED_TRACE(fmt::format("P {} x D {}, M {}, stage {}", stages, grid.replicas, M, grid.stage));
    const Reference ref = train_unsplit(grid.replicas);
    const PipelineRun f1b = train_pipeline(grid, PipelineSchedule::k1f1b, M);
    const PipelineRun gpipe = train_pipeline(grid, PipelineSchedule::kGpipe, M);
    ASSERT_FALSE(f1b.weights.empty());
    const double worst = worst_relative(f1b.weights, ref.weights);
    EXPECT_LT(worst, 1e-5);
    Weights initial;
    {
      Gpt fresh(spec(), Device::cpu(), kSeed);
      for (Parameter* p : fresh.parameters()) initial[p->name] = p->value.to_vector();
    }
    EXPECT_GT(worst_relative(f1b.weights, initial), 1e-2) << "the weights moved";
    std::printf("GPT P %d x D %d, stage %d: worst relative difference %.3g\n", stages, grid.replicas, grid.stage, worst);
    EXPECT_TRUE(f1b.weights == gpipe.weights) << "GPipe and 1F1B must sum the micro-batches in one order";
    EXPECT_TRUE(f1b.norms == gpipe.norms);
    EXPECT_GT(f1b.norms.front(), kClip) << "the clipping acts";
    if (grid.stage == stages - 1) {
      for (size_t s = 0; s < f1b.losses.size(); ++s)
        EXPECT_NEAR(f1b.losses[s], ref.losses[s], 1e-5 * std::fabs(ref.losses[s])) << "step " << s;
    }
    // The first and the last stage's copies of wte: bitwise equal on every replica.
    const std::vector<uint64_t> hashes = allgather_values(test_comm(), f1b.tied_hash);
    for (int d = 0; d < grid.replicas; ++d) {
      const uint64_t first = hashes[static_cast<size_t>(d * stages)];
      const uint64_t last = hashes[static_cast<size_t>(d * stages + stages - 1)];
      EXPECT_NE(first, 0u);
      EXPECT_EQ(first, last) << "replica " << d << ": the tied wte's copies differ";
    }
    grid.chain->shutdown();
    grid.data_parallel->shutdown();
  }
}

// --zero 2 with the tied wte and clipping (Note [Tied stages], Note [Pipeline ZeRO-1]): each
// replica's two ends add their local wte gradients, the reduce-scatter sums those, the norm
// leaves the last stage's chunk of the copy out. The weights equal the unsharded pipeline's and
// the unsplit GPT's within 1e-5 (another association of the wte's sums), the norms within 1e-5,
// and the tied wte's two copies stay bitwise equal. Grids with D > 1 only (2 x 2 at np 4).
TEST(PipelineGpt, ZeroTwoReduceScattersTheTiedWteAndClipsAsTheUnshardedPipeline) {
  const int grids = for_each_replicated_grid([](PipelineGrid& grid) {
    const int stages = grid.stages;
    SCOPED_TRACE(fmt::format("P {} x D {}, --zero 2, stage {}", stages, grid.replicas, grid.stage));
    const Reference ref = train_unsplit(grid.replicas);
    const PipelineRun plain = train_pipeline(grid, PipelineSchedule::k1f1b, 6);
    const PipelineRun zero = train_pipeline(grid, PipelineSchedule::k1f1b, 6, 2);
    ASSERT_FALSE(zero.weights.empty());
    const double worst = worst_relative(zero.weights, plain.weights);
    EXPECT_LT(worst, 1e-5);
    EXPECT_LT(worst_relative(zero.weights, ref.weights), 1e-5);
    ASSERT_EQ(zero.norms.size(), plain.norms.size());
    for (size_t s = 0; s < plain.norms.size(); ++s)
      EXPECT_NEAR(zero.norms[s], plain.norms[s], 1e-5 * plain.norms[s]) << "step " << s;
    EXPECT_GT(zero.norms.front(), kClip) << "the clipping acts";
    const std::vector<uint64_t> hashes = allgather_values(test_comm(), zero.tied_hash);
    for (int d = 0; d < grid.replicas; ++d) {
      const uint64_t first = hashes[static_cast<size_t>(d * stages)];
      EXPECT_NE(first, 0u);
      EXPECT_EQ(first, hashes[static_cast<size_t>(d * stages + stages - 1)])
          << "replica " << d << ": the tied wte's copies differ";
      EXPECT_EQ(first, hashes[0]) << "replica " << d << " differs from replica 0";
    }
    if (test_comm().rank() == 0)
      std::printf("GPT P %d x D %d, --zero 2: worst relative difference %.3g from the unsharded pipeline\n", stages,
                  grid.replicas, worst);
  });
  if (grids == 0) GTEST_SKIP() << "no grid with more than one replica at np " << test_comm().size();
}

// Note [Stage construction]: every range of layers built alone holds the whole Gpt's initial
// values under the same names (the head's wte copy included).
TEST(PipelineGpt, LayersBuiltAloneHoldTheWholeGptsInitialWeights) {
  Weights whole;
  {
    Gpt gpt(spec(), Device::cpu(), kSeed);
    for (Parameter* p : gpt.parameters()) whole[p->name] = p->value.to_vector();
  }
  const size_t n = static_cast<size_t>(spec().layers + 2);
  for (size_t begin = 0; begin < n; ++begin)
    for (size_t end = begin + 1; end <= n; ++end) {
      auto part = build_gpt_layers(spec(), Device::cpu(), kSeed, begin, end);
      ASSERT_EQ(part->size(), end - begin);
      for (Parameter* p : part->parameters())
        EXPECT_TRUE(p->value.to_vector() == whole.at(p->name)) << p->name << " in layers [" << begin << ", " << end << ")";
    }
}

TEST(PipelineGpt, TheHeadHoldsACopyOfWteAndTheCutKeepsEmbeddingsFirstAndHeadLast) {
  const std::vector<LayerSize> layers = plan_gpt_layers(spec());
  ASSERT_EQ(layers.size(), static_cast<size_t>(spec().layers + 2));
  EXPECT_EQ(layers.back().tensors.back().name, kGptTiedParameter);
  for (int P = 2; P <= 5; ++P) {
    const std::vector<StageRange> r = gpt_stage_ranges(spec(), P, {});
    EXPECT_EQ(r.front().begin, 0u);
    EXPECT_EQ(r.back().end, layers.size());
  }
  EXPECT_EQ(gpt_stage_ranges(spec(), 2, {2}), (std::vector<StageRange>{{0, 2}, {2, 5}}));
}

}  // namespace
}  // namespace dtrain
