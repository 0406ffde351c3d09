// ZeRO-1 and ZeRO-2 (Note [ZeRO shards] in ddp/zero_plan.h) at np 2 and 3 on one node: the
// parameters after every step are bitwise those of plain DDP, for SGD with momentum and AdamW,
// with accumulation (no_sync), with the bucket rebuild after step 1 and with a rank that has
// joined (uneven inputs); and each rank holds optimizer state for its chunks only.
#include <algorithm>
#include <cstring>
#include <cmath>
#include <memory>
#include <optional>
#include <random>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "comm/exchange.h"
#include "ddp/distributed_data_parallel.h"
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

  Trainee(const Setting& s, int zero) : model(std::make_unique<LateLastLayer>(11, s.late)) {
    DdpOptions o;
    o.first_bucket_bytes = o.bucket_cap_bytes = 1024;  // several buckets, parameters cut by chunks
    o.zero_stage = zero;
    // no_sync needs the whole gradient; else the ring even where it holds more (Note [ZeRO-2 gradient ring])
    o.gradient_ring = s.accumulate > 1 ? GradientRing::kWhole : GradientRing::kRing;
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
