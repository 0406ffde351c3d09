// ZeRO-1 and ZeRO-2 (Note [ZeRO shards] in ddp/zero_plan.h) at np 2 and 3 on one node: the
// parameters after every step are bitwise those of plain DDP, for SGD with momentum and AdamW,
// with accumulation (no_sync), with the bucket rebuild after step 1 and with a rank that has
// joined (uneven inputs), with --bucket-cap-mb auto's trials (the shards re-cut, optimizer state
// and all, after optimizer steps); and each rank holds optimizer state for its chunks only.
#include <algorithm>
#include <cstring>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <random>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "comm/exchange.h"
#include "ddp/distributed_data_parallel.h"
#include "model/gpt.h"
#include "model/grad_clip.h"
#include "model/loss.h"
#include "model/optimizer.h"
#include "tests/mpi/late_last_layer.h"
#include "tests/mpi/mpi_test_env.h"

namespace dtrain {
namespace {

using testing::LateLastLayer;
using testing::same_on_all_ranks;

Communicator& world() { return testing::test_comm(); }

struct Setting {
  OptimizerKind kind;
  int accumulate;    // micro-batches per step (the first ones inside no_sync)
  bool late;         // the last layer's gradients come last: buckets rebuilt after step 1
  int join_rank;     // this rank runs out of data after step 2 (Join); -1: none
  std::string str() const {
    return fmt::format("{} accumulate {} rebuild {} join {}", optimizer_name(kind), accumulate, late, join_rank);
  }
};

struct Trainee {
  std::unique_ptr<LateLastLayer> model;
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<Optimizer> opt;
  CrossEntropyLoss loss;

  Trainee(const Setting& s, int zero, const std::function<void(DdpOptions&)>& tweak = {})
      : model(std::make_unique<LateLastLayer>(11, s.late)) {
    DdpOptions o;
    o.first_bucket_bytes = o.bucket_cap_bytes = 1024;  // several buckets, parameters cut by chunks
    o.zero_stage = zero;
    // no_sync needs the whole gradient; else the ring even where it holds more (Note [ZeRO-2 gradient ring])
    o.gradient_ring = s.accumulate > 1 ? GradientRing::kWhole : GradientRing::kRing;
    if (tweak) tweak(o);
    ddp = std::make_unique<DistributedDataParallel>(*model, testing::test_runtime(), o);
    OptimizerSpec spec;
    spec.kind = s.kind;
    spec.lr = s.kind == OptimizerKind::kSgd ? 0.05f : 0.01f;
    spec.weight_decay = 0.05f;
    spec.decay_matrices_only = s.kind == OptimizerKind::kAdamW;
    opt = make_optimizer(spec, model->parameters());
  }
  std::optional<GradNormClipper> clipper;
  float max_norm = 0.f;
  void step(const Setting& s, int n) {
    opt->zero_grad();
    if (s.join_rank == world().rank() && n >= 2) {
      ddp->join_backward();
    } else {
      for (int m = 0; m < s.accumulate; ++m) {
        auto [x, y] = testing::rank_batch(n * s.accumulate + m);
        loss.forward(ddp->forward(x), y);
        if (m + 1 < s.accumulate) {
          auto guard = ddp->no_sync();
          ddp->backward(loss.backward());
        } else {
          ddp->backward(loss.backward());
        }
      }
    }
    if (clipper) clipper->clip(max_norm);
    opt->step();
  }
  std::string bytes() {
    std::string out;
    for (Parameter* p : model->parameters())
      out.append(reinterpret_cast<const char*>(p->value.data()), p->value.nbytes());
    return out;
  }
};

TEST(Zero, StagesOneAndTwoGiveThePlainDdpBitsEveryStep) {
  std::vector<Setting> settings;
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdamW}) {
    settings.push_back({kind, 1, false, -1});
    settings.push_back({kind, 3, false, -1});
    settings.push_back({kind, 1, true, -1});
    settings.push_back({kind, 2, true, 1});
    settings.push_back({kind, 1, true, 1});  // ZeRO-2's ring through a rebuild and Join
  }
  for (const Setting& s : settings) {
    Trainee plain(s, 0), z1(s, 1), z2(s, 2);
    for (int n = 0; n < 4; ++n) {
      plain.step(s, n);
      z1.step(s, n);
      z2.step(s, n);
      const std::string want = plain.bytes();
      EXPECT_TRUE(z1.bytes() == want) << "ZeRO-1 differs from plain DDP after step " << n + 1 << ": " << s.str()
                                      << " rank " << world().rank();
      EXPECT_TRUE(z2.bytes() == want) << "ZeRO-2 differs from plain DDP after step " << n + 1 << ": " << s.str()
                                      << " rank " << world().rank();
    }
    EXPECT_TRUE(same_on_all_ranks(z2.bytes())) << s.str();
    EXPECT_EQ(z2.opt->store().grads_lent(), s.accumulate == 1) << "the gradient ring is used without no_sync: " << s.str();
    if (s.late) {
      EXPECT_NE(z1.ddp->bucket_layout().ready_order, reverse_parameter_order(z1.model->parameters().size()))
          << "the buckets were not rebuilt";
    }
  }
}

std::string layout_text(DistributedDataParallel& ddp) {
  std::string out;
  for (const GradBucket& b : ddp.reducer().buckets()) out += fmt::format("[{}]", fmt::join(b.params, " "));
  return out;
}

// Note [Re-cutting sharded state] (model/flat_store.h): --bucket-cap-mb auto moves the buckets,
// and so the chunks, after optimizer steps: each rank's optimizer state (and ZeRO-2's reduced
// gradients) is re-cut through the other ranks' parts. The same tuner decisions as plain DDP (a
// fixed cost per candidate) give its parameters bit for bit after every step.
TEST(Zero, AutotunedBucketsGiveThePlainDdpBitsEveryStep) {
  const auto autotune = [](DdpOptions& o) {
    o.bucket_cap_auto = true;
    // Candidate 1 (every parameter a bucket of its own) wins: tried after candidate 0, chosen
    // after candidate 2 (one bucket), so the chunks move three times after optimizer steps.
    o.autotune_candidates = {{1024, 1024}, {1, 1}, {size_t{1} << 20, size_t{1} << 20}};
    o.autotune_warmup_steps = 1;
    o.autotune_measured_steps = 1;
    o.autotune_step_ms = [](size_t candidate, double) { return candidate == 1 ? 1.0 : 5.0; };
  };
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdamW})
    for (int accumulate : {1, 2}) {
      const Setting s{kind, accumulate, true, -1};
      Trainee plain(s, 0, autotune), z1(s, 1, autotune), z2(s, 2, autotune);
      std::vector<std::string> layouts;
      for (int n = 0; n < 10; ++n) {
        plain.step(s, n);
        z1.step(s, n);
        z2.step(s, n);
        const std::string want = plain.bytes();
        EXPECT_TRUE(z1.bytes() == want) << "ZeRO-1 differs from plain DDP after step " << n + 1 << ": " << s.str();
        EXPECT_TRUE(z2.bytes() == want) << "ZeRO-2 differs from plain DDP after step " << n + 1 << ": " << s.str();
        EXPECT_EQ(layout_text(*z2.ddp), layout_text(*plain.ddp)) << "step " << n + 1;
        if (layouts.empty() || layouts.back() != layout_text(*z1.ddp)) layouts.push_back(layout_text(*z1.ddp));
      }
      ASSERT_TRUE(z1.ddp->bucket_layout_final() && z2.ddp->bucket_layout_final()) << s.str();
      EXPECT_EQ(z1.ddp->bucket_layout().bucket_cap_bytes, 1u) << "candidate 1 chosen";
      EXPECT_GE(layouts.size(), 4u) << "the rebuild, then candidates 1, 2 and 1 again: " << fmt::format("{}", fmt::join(layouts, " "));
      EXPECT_TRUE(same_on_all_ranks(z2.bytes())) << s.str();
      EXPECT_EQ(z2.opt->store().grads_lent(), accumulate == 1) << s.str();
    }
}

// Note [Compressed reduce-scatter] (ddp/comm_hook.cpp): ZeRO-2 with --comm-hook bf16|fp16
// reduce-scatters the 16-bit words. At two ranks each element is the one 16-bit sum of the same
// two words either way: plain DDP's parameters with the same hook, bit for bit (AdamW). At three,
// MPI may pair the ranks' words in another order, each sum then rounding otherwise to 16 bits:
// with SGD (whose step is linear in the gradient; AdamW's sign-like step turns a rounding of a
// near-zero gradient into a whole step) the distance to plain DDP with the hook stays within
// the compression's own, the distance from it to float32 plain DDP.
TEST(Zero, StageTwoCompressedGivesThePlainDdpBitsWithTheSameHook) {
  for (CommHookKind hook : {CommHookKind::kBf16, CommHookKind::kFp16})
    for (int accumulate : {1, 2}) {  // the ring, and the whole local gradient
      const Setting s{world().size() == 2 ? OptimizerKind::kAdamW : OptimizerKind::kSgd, accumulate, true, -1};
      const auto with_hook = [hook](DdpOptions& o) { o.comm_hook = hook; };
      Trainee fp32(s, 0), plain(s, 0, with_hook), z2(s, 2, with_hook);
      for (int n = 0; n < 4; ++n) {
        fp32.step(s, n);
        plain.step(s, n);
        z2.step(s, n);
        const std::string what = fmt::format("{} after step {}: {}", comm_hook_name(hook), n + 1, s.str());
        if (world().size() == 2) {
          EXPECT_TRUE(z2.bytes() == plain.bytes()) << what;
          continue;
        }
        double to_plain = 0, compression = 0;
        std::vector<Parameter*> a = plain.model->parameters(), b = z2.model->parameters(), c = fp32.model->parameters();
        for (size_t i = 0; i < a.size(); ++i) {
          const std::vector<float> x = a[i]->value.to_vector(), y = b[i]->value.to_vector(), z = c[i]->value.to_vector();
          for (size_t k = 0; k < x.size(); ++k) {
            to_plain = std::max(to_plain, static_cast<double>(std::abs(y[k] - x[k])));
            compression = std::max(compression, static_cast<double>(std::abs(z[k] - x[k])));
          }
        }
        EXPECT_LE(to_plain, compression) << what;  // measured: 0.15 to 0.3 of it
      }
      EXPECT_FALSE(plain.bytes() == fp32.bytes()) << "the hook compressed nothing";
      EXPECT_TRUE(same_on_all_ranks(z2.bytes())) << s.str();
      EXPECT_EQ(z2.opt->store().grads_lent(), accumulate == 1) << s.str();
    }
}

// Note [ZeRO-2 gradient ring]: a rank holds its chunks of the reduced gradient and the ring's
// bucket buffers, not the whole gradient.
TEST(Zero, StageTwoHoldsItsChunksOfTheGradientAndARing) {
  const Setting s{OptimizerKind::kSgd, 1, false, -1};
  Trainee plain(s, 0), z2(s, 2);
  for (int n = 0; n < 2; ++n) plain.step(s, n), z2.step(s, n);
  const std::vector<GradBucket>& buckets = z2.ddp->reducer().buckets();
  int64_t largest = 0, chunks = 0;
  for (const GradBucket& b : buckets) largest = std::max(largest, b.buffer.numel()), chunks += b.shard_elements;
  const size_t want = static_cast<size_t>(chunks + 2 * largest) * sizeof(float);
  EXPECT_EQ(z2.opt->store().grad_bytes(), want) << "its chunks and two bucket buffers";
  EXPECT_FALSE(z2.opt->store().grads().defined()) << "no flat gradient";
  EXPECT_LT(static_cast<int64_t>(chunks), static_cast<int64_t>(plain.opt->store().grad_bytes() / sizeof(float)) * 2 / 3);
}

// --clip-grad-norm under ZeRO-2: each rank's chunks' sum of squares, added over the ranks; the
// same norm on every rank, within rounding of plain DDP's whole-gradient norm, and so the same
// parameters within 1e-6.
TEST(Zero, StageTwoClipsByTheGlobalNormOfTheShards) {
  // The ring (accumulate 1) and the whole local gradient (accumulate 2: only the chunks reduced).
  for (const Setting& s : {Setting{OptimizerKind::kSgd, 1, true, -1}, Setting{OptimizerKind::kSgd, 2, true, -1}}) {
  Trainee plain(s, 0), z2(s, 2);
  plain.max_norm = z2.max_norm = 0.05f;  // below the norms of these steps: every step is clipped
  plain.clipper.emplace(plain.model->parameters());
  z2.clipper.emplace(z2.model->parameters(), [](float x) {
    world().allreduce(&x, 1, DType::kF32, ReduceOp::kSum);
    return x;
  });
  for (int n = 0; n < 4; ++n) {
    plain.step(s, n);
    z2.step(s, n);
    const float want = plain.clipper->last_norm(), got = z2.clipper->last_norm();
    EXPECT_GT(want, plain.max_norm) << "step " << n + 1 << " was not clipped";
    EXPECT_NEAR(got, want, 1e-6 * want) << "step " << n + 1;
    EXPECT_TRUE(same_on_all_ranks(std::string(reinterpret_cast<const char*>(&got), sizeof got))) << "step " << n + 1;
    std::vector<Parameter*> a = plain.model->parameters(), b = z2.model->parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      const std::vector<float> x = a[i]->value.to_vector(), y = b[i]->value.to_vector();
      for (size_t k = 0; k < x.size(); ++k)
        ASSERT_NEAR(y[k], x[k], 1e-6 * std::max(1.f, std::abs(x[k]))) << a[i]->name << " step " << n + 1 << " " << s.str();
    }
  }
  }
}

// Note [ZeRO-2 gradient ring], kAuto: the choice counts two slots, and two suffice for the GPT's
// tied embedding: the head writes it at the start of backward and it is ready at the end, so its
// bucket holds one slot all backward while the other buckets take turns in the second (each
// waits for the one before to be reduced); the ring does not grow, before the rebuild after step
// 1 or after it, so the start-up figure stays true.
TEST(Zero, StageTwoAutoRingCountsTwoSlotsWhichHoldTheTiedEmbedding) {
  for (bool rebuild : {false, true}) {
    Gpt model(GptSpec{11, 5, 2, 2, 8}, Device::cpu(), 5);
    DdpOptions o;
    o.first_bucket_bytes = o.bucket_cap_bytes = 1024;
    o.zero_stage = 2;  // gradient_ring kAuto
    o.rebuild_buckets = rebuild;
    DistributedDataParallel ddp(model, testing::test_runtime(), o);
    AdamW opt(model.parameters(), AdamWOptions{});
    FlatStore& store = opt.store();
    ASSERT_TRUE(store.grads_lent()) << "kAuto lends the ring to this model in many small buckets";
    // The bytes of the owned chunks and `slots` ring slots of the current buckets.
    const auto ring_bytes = [&](int64_t slots) {
      int64_t largest = 0, chunks = 0;
      for (const GradBucket& b : ddp.reducer().buckets())
        largest = std::max(largest, b.buffer.numel()), chunks += b.shard_elements;
      return static_cast<size_t>(chunks + slots * largest) * sizeof(float);
    };
    EXPECT_EQ(store.grad_bytes(), ring_bytes(2)) << "decided and reported from two slots";
    CrossEntropyLoss loss;
    for (int n = 0; n < 3; ++n) {
      std::mt19937 gen(static_cast<uint32_t>(100 * n + world().rank()));
      std::vector<int32_t> ids(2 * 5), next(2 * 5);
      for (int32_t& t : ids) t = static_cast<int32_t>(gen() % 11);
      for (int32_t& t : next) t = static_cast<int32_t>(gen() % 11);
      Tensor x = Tensor::empty({2, 5}, Device::cpu(), DType::kI32), y = Tensor::empty({10}, Device::cpu(), DType::kI32);
      std::memcpy(x.raw(), ids.data(), sizeof(int32_t) * ids.size());
      std::memcpy(y.raw(), next.data(), sizeof(int32_t) * next.size());
      opt.zero_grad();
      loss.forward(ddp.forward(x), y);
      ddp.backward(loss.backward());
      opt.step();
      EXPECT_EQ(store.grad_bytes(), ring_bytes(2)) << "after step " << n + 1 << ", rebuild " << rebuild;
    }
  }
}

TEST(Zero, EachRankKeepsStateForItsChunksOnly) {
  const Setting s{OptimizerKind::kAdamW, 1, false, -1};
  Trainee plain(s, 0), z1(s, 1);
  for (int n = 0; n < 2; ++n) plain.step(s, n), z1.step(s, n);
  // The state elements over all ranks are the plain state's (padding aside).
  int32_t mine = static_cast<int32_t>(z1.opt->state_bytes() / sizeof(float));
  int32_t total = mine;
  world().allreduce(&total, 1, DType::kI32, ReduceOp::kSum);
  const int64_t whole = static_cast<int64_t>(plain.opt->state_bytes() / sizeof(float));
  EXPECT_LE(total, whole + 2 * 16 * world().size() * static_cast<int64_t>(z1.ddp->reducer().buckets().size()));
  EXPECT_LE(mine, whole / world().size() + 2 * 16 * static_cast<int64_t>(z1.ddp->reducer().buckets().size()));
  // Its exported entries are slices or tensors of the parameters it has pieces of.
  const OptimizerState state = z1.opt->export_state();
  int64_t exported = 0;
  for (const OptimizerState::Entry& e : state.tensors) exported += e.value.numel();
  int32_t all_exported = static_cast<int32_t>(exported);
  world().allreduce(&all_exported, 1, DType::kI32, ReduceOp::kSum);
  int64_t params = 0;
  for (Parameter* p : z1.model->parameters()) params += p->value.numel();
  EXPECT_EQ(all_exported, 2 * params) << "exp_avg and exp_avg_sq of every element, once over the ranks";
}

}  // namespace
}  // namespace dtrain
