// DistributedDataParallel at np 2 and 3: PyTorch's own DDP equivalence test (N ranks x batch B
// == one process x batch N*B), bitwise-identical replicas, overlap of all-reduce and backward,
// no_sync accumulation, unused parameters, mismatched models, compressed hooks.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/kernels.h"
#include "core/ops.h"
#include "tests/mpi/mpi_test_env.h"
#include "ddp/distributed_data_parallel.h"
#include "model/linear.h"
#include "model/loss.h"
#include "model/models.h"
#include "model/optimizer.h"

namespace dtrain {
namespace {

Communicator& world() { return testing::test_comm(); }
Runtime& runtime() { return testing::test_runtime(); }

struct GlobalBatch {
  std::vector<float> images;   // [N*B, 1, 8, 8]
  std::vector<int32_t> labels;
};

GlobalBatch make_global_batch(int64_t rows, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> px(0.f, 1.f);
  std::uniform_int_distribution<int> cls(0, 9);
  GlobalBatch g;
  g.images.resize(static_cast<size_t>(rows * 64));
  for (float& v : g.images) v = px(gen);
  for (int64_t i = 0; i < rows; ++i) g.labels.push_back(cls(gen));
  return g;
}

// Rows [first, first + count) of the global batch as tensors.
std::pair<Tensor, Tensor> rows_of(const GlobalBatch& g, int64_t first, int64_t count) {
  Tensor x = Tensor::from_vector(std::span<const float>(g.images.data() + first * 64, static_cast<size_t>(count * 64)),
                                 {count, 1, 8, 8});
  Tensor y = Tensor::empty({count}, Device::cpu(), DType::kI32);
  std::memcpy(y.raw(), g.labels.data() + first, static_cast<size_t>(count) * 4);
  return {x, y};
}

// Every parameter's `field` (&Parameter::value or &Parameter::grad), concatenated.
std::vector<float> flat(Module& m, Tensor Parameter::*field = &Parameter::value) {
  std::vector<float> out;
  for (Parameter* p : m.parameters()) {
    auto v = (p->*field).to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

using testing::bitwise_equal_on_all_ranks;

// Parameters after an optimizer step: equal only if every rank applied the same gradients.
bool replicas_bitwise_equal(Module& m) { return bitwise_equal_on_all_ranks(flat(m)); }

// Gradients after a synced backward on rank-dependent data: equal only if they were reduced.
// (Parameters right after a backward are always equal: they have not changed since the
// broadcast, so comparing them would test nothing.)
bool gradients_bitwise_equal(Module& m) { return bitwise_equal_on_all_ranks(flat(m, &Parameter::grad)); }

std::unique_ptr<Optimizer> make_opt(const std::string& kind, Module& m) {
  if (kind == "sgd") return std::make_unique<Sgd>(m.parameters(), SgdOptions{0.05f, 0.9f, 0.f, 1e-4f, false});
  return std::make_unique<AdamW>(m.parameters(), AdamWOptions{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f});
}

class Equivalence : public ::testing::TestWithParam<std::tuple<std::string, double>> {};

TEST_P(Equivalence, NRanksBatchBEqualsOneProcessBatchNB) {
  const auto [opt_kind, bucket_cap_mb] = GetParam();
  const int n = world().size(), rank = world().rank();
  const int64_t B = 4, steps = 6;
  const ModelSpec spec{ModelKind::kMlp, {32, 16}};
  auto model = build_model(spec, {1, 8, 8}, 10, Device::cpu(), 11 + rank);  // different init per rank:
  auto reference = build_model(spec, {1, 8, 8}, 10, Device::cpu(), 11);     // DDP must broadcast rank 0's
  DdpOptions options;
  options.bucket_cap_bytes = static_cast<size_t>(bucket_cap_mb * 1024 * 1024);
  options.first_bucket_bytes = std::min<size_t>(options.bucket_cap_bytes, options.first_bucket_bytes);
  DistributedDataParallel ddp(*model, runtime(), options);
  ASSERT_EQ(flat(*model), flat(*reference));
  auto opt = make_opt(opt_kind, *model);
  auto ref_opt = make_opt(opt_kind, *reference);
  CrossEntropyLoss loss, ref_loss;

  for (int64_t step = 0; step < steps; ++step) {
    GlobalBatch g = make_global_batch(n * B, static_cast<uint32_t>(100 + step));
    auto [x, y] = rows_of(g, rank * B, B);
    opt->zero_grad();
    loss.forward(ddp.forward(x), y);
    ddp.backward(loss.backward());
    opt->step();

    auto [gx, gy] = rows_of(g, 0, n * B);
    ref_opt->zero_grad();
    ref_loss.forward(reference->forward(gx), gy);
    reference->backward(ref_loss.backward(), false);
    ref_opt->step();

    ASSERT_TRUE(replicas_bitwise_equal(*model)) << "replicas diverged at step " << step;
  }
  std::vector<float> got = flat(*model), want = flat(*reference);
  double max_rel = 0;
  for (size_t i = 0; i < got.size(); ++i)
    max_rel = std::max(max_rel, std::abs(got[i] - want[i]) / std::max(1e-3, static_cast<double>(std::abs(want[i]))));
  EXPECT_LT(max_rel, 1e-5) << opt_kind << " with " << ddp.reducer().buckets().size() << " bucket(s)";
}

INSTANTIATE_TEST_SUITE_P(OptimizersAndBuckets, Equivalence,
                         ::testing::Combine(::testing::Values("sgd", "adamw"), ::testing::Values(25.0, 0.002)));

// Largest |a - b| over the largest |b|: a tensor's error on the scale of its values.
double tensor_rel(const Tensor& a, const Tensor& b) {
  const std::vector<float> u = a.to_vector(), v = b.to_vector();
  double worst = 0, scale = 1e-30;
  for (size_t i = 0; i < u.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(u[i] - v[i])));
    scale = std::max(scale, static_cast<double>(std::abs(v[i])));
  }
  return worst / scale;
}

struct SyncBnDifference {
  double logits = 0;  // the first forward's, this rank's rows against the same rows at batch NB
  double state = 0;   // after one SGD step: every parameter and running statistic, per tensor
};

// Note [SyncBatchNorm]: a resnet18 (width 2, 8x8 images: its last stage normalises 1x1 planes
// of B samples) at N ranks x batch B, with or without SyncBatchNorm, against one process at batch
// NB, from the same weights.
SyncBnDifference sync_bn_difference(bool sync) {
  const int n = world().size(), rank = world().rank();
  const int64_t B = 4;
  ModelSpec spec;
  spec.kind = ModelKind::kResnet18;
  spec.width = 2;
  auto model = build_model(spec, {1, 8, 8}, 10, Device::cpu(), 11);
  auto reference = build_model(spec, {1, 8, 8}, 10, Device::cpu(), 11);
  DdpOptions options;
  options.sync_batchnorm = sync;
  DistributedDataParallel ddp(*model, runtime(), options);
  auto opt = make_opt("sgd", *model);
  auto ref_opt = make_opt("sgd", *reference);
  CrossEntropyLoss loss, ref_loss;
  GlobalBatch g = make_global_batch(n * B, 300);
  auto [x, y] = rows_of(g, rank * B, B);
  auto [gx, gy] = rows_of(g, 0, n * B);
  opt->zero_grad();
  ref_opt->zero_grad();
  SyncBnDifference d;
  const Tensor logits = ddp.forward(x);
  const Tensor ref_logits = reference->forward(gx);
  d.logits = tensor_rel(logits, ref_logits.slice(rank * B * 10, {B, 10}));
  loss.forward(logits, y);
  ddp.backward(loss.backward());
  opt->step();
  ref_loss.forward(ref_logits, gy);
  reference->backward(ref_loss.backward(), false);
  ref_opt->step();
  EXPECT_TRUE(replicas_bitwise_equal(*model));
  std::vector<Tensor*> got, want;
  for (Parameter* p : model->parameters()) got.push_back(&p->value);
  for (Parameter* p : reference->parameters()) want.push_back(&p->value);
  for (Buffer* b : model->buffers())
    if (b->value.dtype() == DType::kF32) got.push_back(&b->value);
  for (Buffer* b : reference->buffers())
    if (b->value.dtype() == DType::kF32) want.push_back(&b->value);
  EXPECT_EQ(got.size(), want.size());
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i)
    d.state = std::max(d.state, tensor_rel(*got[i], *want[i]));
  return d;
}

// The 1e-5, per tensor (largest |difference| / largest |value|), for the logits and for
// every parameter and running statistic after one SGD step. The BatchNorm biases are the tight
// ones: their gradients are channel sums that nearly cancel, so float rounding in the combined
// statistics shows there (PyTorch's float gather of mean and invstd: 1.2e-5; each rank's mean and
// variance as float + remainder: 3.2e-6 at np 2, 2.3e-6 at np 3 with im2col convolutions, 1.6e-6
// at both with the direct CPU kernels on AVX-512 (2026-11-27); Note [SyncBatchNorm statistics]
// in model/norm_kernels.h). Plain BatchNorm is far off (each rank normalises its own B samples;
// measured 9.3 after one step): the test sees the property.
TEST(SyncBatchNorm, NRanksBatchBEqualsOneProcessBatchNB) {
  const SyncBnDifference synced = sync_bn_difference(true);
  EXPECT_LT(synced.logits, 1e-5);
  EXPECT_LT(synced.state, 1e-5);
  const SyncBnDifference plain = sync_bn_difference(false);
  EXPECT_GT(plain.logits, 1e-2);
  EXPECT_GT(plain.state, 1e-1);
  if (world().rank() == 0)
    std::printf("SyncBatchNorm np %d x 4 vs 1 x %d: logits %.2e, state after a step %.2e (plain BatchNorm: %.2e, "
                "%.2e)\n",
                world().size(), 4 * world().size(), synced.logits, synced.state, plain.logits, plain.state);
}

TEST(Overlap, ABucketAllReduceStartsBeforeBackwardEnds) {
  // 784-2048-2048-10: 23 MB of gradients, so the first (1 MiB) bucket closes at 2.weight.
  auto model = build_model(ModelSpec{ModelKind::kMlp, {2048, 2048}}, {1, 28, 28}, 10, Device::cpu(), 3);
  DistributedDataParallel ddp(*model, runtime());
  size_t grad_bytes = 0;
  for (Parameter* p : model->parameters()) grad_bytes += p->grad.nbytes();
  ASSERT_GE(grad_bytes, 16u << 20);
  const auto& buckets = ddp.reducer().buckets();
  ASSERT_GE(buckets.size(), 2u);
  // Record when each gradient hook fires, then hand the parameter to the reducer as DDP does.
  std::map<std::string, int64_t> ready_ns;
  model->set_grad_ready_hook([&](Parameter& p) {
    ready_ns[p.name] = steady_now_ns();
    ddp.reducer().mark_ready(p);
  });
  // Rank-dependent data: without the all-reduce the ranks' gradients would differ.
  const float pixel = 0.1f * static_cast<float>(world().rank() + 1);
  Tensor x = Tensor::from_vector(std::vector<float>(8 * 784, pixel), {8, 1, 28, 28});
  Tensor y = Tensor::zeros({8}, Device::cpu(), DType::kI32);
  CrossEntropyLoss loss;
  loss.forward(ddp.forward(x), y);
  ddp.backward(loss.backward());
  // Bucket 0 holds the last layers' gradients; the first layer's come last in backward and sit
  // in the last bucket. Overlap means bucket 0's all-reduce was launched before those hooks ran.
  ASSERT_EQ(ready_ns.size(), model->parameters().size());
  const size_t first_layer_bucket = buckets.size() - 1;
  for (size_t p : buckets[first_layer_bucket].params) {
    const std::string& name = model->parameters()[p]->name;
    EXPECT_LT(buckets[0].launched_ns, ready_ns.at(name))
        << "bucket 0 was launched only after the gradient of " << name << " (an earlier layer) was ready";
  }
  EXPECT_GE(ddp.reducer().stats().buckets_launched_during_backward, 1);
  EXPECT_TRUE(gradients_bitwise_equal(*model));
}

TEST(NoSync, AccumulatedMicroBatchesEqualOneBigBatch) {
  const int n = world().size(), rank = world().rank();
  const int64_t B = 3, K = 4;
  auto model = build_model(ModelSpec{ModelKind::kMlp, {16}}, {1, 8, 8}, 10, Device::cpu(), 5);
  auto reference = build_model(ModelSpec{ModelKind::kMlp, {16}}, {1, 8, 8}, 10, Device::cpu(), 5);
  DistributedDataParallel ddp(*model, runtime());
  GlobalBatch g = make_global_batch(n * B * K, 77);
  CrossEntropyLoss loss(Reduction::kSum), ref_loss(Reduction::kSum);
  for (Parameter* p : model->parameters()) p->grad.zero_();
  for (int64_t k = 0; k < K; ++k) {
    auto [x, y] = rows_of(g, (k * n + rank) * B, B);  // micro-batch k of this rank
    loss.forward(ddp.forward(x), y);
    if (k < K - 1) {
      auto guard = ddp.no_sync();
      ddp.backward(loss.backward());
    } else {
      ddp.backward(loss.backward());
    }
  }
  EXPECT_EQ(ddp.reducer().stats().synced_backwards, 1);
  auto [gx, gy] = rows_of(g, 0, n * B * K);
  for (Parameter* p : reference->parameters()) p->grad.zero_();
  ref_loss.forward(reference->forward(gx), gy);
  reference->backward(ref_loss.backward(), false);
  auto params = model->parameters(), ref_params = reference->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    auto got = params[i]->grad.to_vector(), want = ref_params[i]->grad.to_vector();
    for (size_t j = 0; j < got.size(); ++j)  // DDP averages: sum over ranks / n
      ASSERT_NEAR(got[j], want[j] / n, 1e-5 * (1 + std::abs(want[j]))) << params[i]->name << "[" << j << "]";
  }
}

// A Linear followed by a parameter that forward never uses.
class WithUnusedParameter : public Module {
 public:
  WithUnusedParameter() : linear_(64, 10, Device::cpu(), rng_) {
    unused_ = {"unused", Tensor::zeros({5}), Tensor::zeros({5})};
  }
  Tensor forward(const Tensor& x) override { return linear_.forward(x.view({x.dim(0), 64})); }
  Tensor backward(const Tensor& g, bool need) override { return linear_.backward(g, need); }
  std::vector<Parameter*> parameters() override {
    auto p = linear_.parameters();
    p.push_back(&unused_);
    return p;
  }
  void set_grad_ready_hook(GradReadyHook hook) override { linear_.set_grad_ready_hook(std::move(hook)); }
  std::string describe() const override { return "WithUnusedParameter"; }

 private:
  InitRng rng_{1};
  Linear linear_;
  Parameter unused_;
};

TEST(UnusedParameters, ErrorWithoutFlagNamesTheParameter) {
  WithUnusedParameter model;
  DistributedDataParallel ddp(model, runtime());
  auto [x, y] = rows_of(make_global_batch(2, 1), 0, 2);
  CrossEntropyLoss loss;
  loss.forward(ddp.forward(x), y);
  try {
    ddp.backward(loss.backward());
    FAIL() << "expected an error";
  } catch (const dtrain::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unused received no gradient"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("enable find_unused_parameters"), std::string::npos) << e.what();
  }
}

TEST(UnusedParameters, WithFlagTheyAreReadyWithZeroGradient) {
  WithUnusedParameter model;
  DdpOptions options;
  options.find_unused_parameters = true;
  DistributedDataParallel ddp(model, runtime(), options);
  model.parameters()[2]->grad.copy_from(Tensor::from_vector(std::vector<float>(5, 3.f), {5}));  // stale
  auto [x, y] = rows_of(make_global_batch(2 * world().size(), 1), 2 * world().rank(), 2);
  CrossEntropyLoss loss;
  loss.forward(ddp.forward(x), y);
  ddp.backward(loss.backward());
  EXPECT_EQ(model.parameters()[2]->grad.to_vector(), std::vector<float>(5, 0.f));
  EXPECT_TRUE(gradients_bitwise_equal(model));
}

// Under ZeRO-2's gradient ring (Note [ZeRO-2 gradient ring] in ddp/reducer.h) a bucket with only
// an unused parameter borrows its buffer in finalize_backward: the steps are plain DDP's bits.
TEST(UnusedParameters, ZeroTwoRingStepsLikePlainDdp) {
  std::string after[2];
  for (int zero : {0, 2}) {
    WithUnusedParameter model;
    DdpOptions options;
    options.find_unused_parameters = true;
    options.zero_stage = zero;
    options.gradient_ring = GradientRing::kRing;  // (the whole gradient is smaller here)
    options.first_bucket_bytes = options.bucket_cap_bytes = 16;  // a bucket per parameter: the unused one alone
    DistributedDataParallel ddp(model, runtime(), options);
    SgdOptions so;
    so.lr = 0.1f;
    so.momentum = 0.9f;
    Sgd opt(model.parameters(), so);
    for (uint32_t step = 0; step < 3; ++step) {
      opt.zero_grad();
      auto [x, y] = rows_of(make_global_batch(2 * world().size(), 10 + step), 2 * world().rank(), 2);
      CrossEntropyLoss loss;
      loss.forward(ddp.forward(x), y);
      ddp.backward(loss.backward());
      opt.step();
    }
    if (zero == 2) {
      EXPECT_TRUE(opt.store().grads_lent()) << "the ring is in use";
    }
    for (Parameter* p : model.parameters())
      after[zero / 2].append(reinterpret_cast<const char*>(p->value.data()), p->value.nbytes());
  }
  EXPECT_TRUE(after[0] == after[1]) << "--zero 2 with an unused parameter differs from plain DDP";
}

// Wrapping `model` must fail on every rank: rank 1, the one that differs, names the difference
// (`rank1_message`); the others say how many ranks differ.
void expect_model_check_fails(Module& model, const std::string& rank1_message) {
  const int rank = world().rank();
  try {
    DistributedDataParallel ddp(model, runtime());
    FAIL() << "expected an error on rank " << rank;
  } catch (const dtrain::Error& e) {
    const std::string msg = e.what();
    if (rank == 1)
      EXPECT_EQ(msg, rank1_message);
    else
      EXPECT_EQ(msg, "1 rank(s) disagree with rank 0 on the model (their errors name the difference)");
  }
}

TEST(ModelMismatch, RanksThatDisagreeFailFastWithTheDifference) {
  auto model = build_model(ModelSpec{ModelKind::kMlp, {world().rank() == 1 ? 32 : 16}}, {1, 8, 8}, 10, Device::cpu(), 1);
  expect_model_check_fails(*model, "rank 1 disagrees with rank 0 on the model: parameter '1.weight' has shape "
                                   "[32, 64] here but [16, 64] on rank 0");
}

// Non-trained state that must match across replicas, as BatchNorm's running statistics would.
class WithBuffer : public Module {
 public:
  WithBuffer(int64_t state_size, float state_value)
      : linear_(64, 10, Device::cpu(), rng_),
        state_{"state", Tensor::from_vector(std::vector<float>(static_cast<size_t>(state_size), state_value),
                                            {state_size})} {}
  Tensor forward(const Tensor& x) override { return linear_.forward(x.view({x.dim(0), 64})); }
  Tensor backward(const Tensor& g, bool need) override { return linear_.backward(g, need); }
  std::vector<Parameter*> parameters() override { return linear_.parameters(); }
  std::vector<Buffer*> buffers() override { return {&state_}; }
  void set_grad_ready_hook(GradReadyHook hook) override { linear_.set_grad_ready_hook(std::move(hook)); }
  std::string describe() const override { return "WithBuffer"; }
  const Tensor& state() const { return state_.value; }

 private:
  InitRng rng_{1};
  Linear linear_;
  Buffer state_;
};

TEST(ModelMismatch, ABufferOfAnotherShapeIsNamed) {
  WithBuffer model(world().rank() == 1 ? 3 : 2, 0.f);
  expect_model_check_fails(model, "rank 1 disagrees with rank 0 on the model: buffer 'state' has shape [3] here but [2] "
                                  "on rank 0");
}

TEST(ModelMismatch, AParameterWhereRankZeroHasABufferIsNamed) {
  std::unique_ptr<Module> model;
  if (world().rank() == 1)
    model = std::make_unique<WithUnusedParameter>();
  else
    model = std::make_unique<WithBuffer>(5, 0.f);
  expect_model_check_fails(*model, "rank 1 disagrees with rank 0 on the model: entry #2 is parameter 'unused' here "
                                   "but buffer 'state' on rank 0");
}

TEST(Broadcast, BuffersStartAsRankZerosCopy) {
  WithBuffer model(4, static_cast<float>(world().rank() + 1));
  DistributedDataParallel ddp(model, runtime());
  EXPECT_EQ(model.state().to_vector(), std::vector<float>(4, 1.f));
}

// Note [Buffer broadcast]: a resnet18 (width 2, 8x8 images) whose first BatchNorm's running mean
// differs on every rank; every rank then runs the same batch.
struct DivergedResnet {
  std::unique_ptr<Sequential> model = build_model(ModelSpec{.kind = ModelKind::kResnet18, .width = 2}, {1, 8, 8}, 10,
                                                  Device::cpu(), 3);
  Tensor& running_mean() {
    for (Buffer* b : model->buffers())
      if (b->name == "bn1.running_mean") return b->value;
    throw Error("no bn1.running_mean");
  }
  // running_mean = 10 (rank + 1) on every rank.
  void diverge() { fill(running_mean(), 10.f * static_cast<float>(world().rank() + 1)); }
  void forward(DistributedDataParallel& ddp) {
    std::vector<float> x(4 * 64);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.1f * static_cast<float>(i));
    ddp.forward(Tensor::from_vector(x, {4, 1, 8, 8}));
  }
  // After one training forward from running_mean r: 0.9 r + 0.1 * (the batch's mean), the same
  // batch on every rank; so the value tells which rank's r the forward started from.
  float started_from() { return running_mean().to_vector()[0]; }
};

float after_forward_from(float start) {
  DivergedResnet fresh;  // the same seed: the same weights, so the same batch mean
  fill(fresh.running_mean(), start);
  std::vector<float> x(4 * 64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.1f * static_cast<float>(i));
  fresh.model->forward(Tensor::from_vector(x, {4, 1, 8, 8}));
  return fresh.started_from();
}

TEST(BufferBroadcast, ADivergedRunningMeanIsReplacedByRankZerosBeforeTheNextForward) {
  DivergedResnet r;
  DistributedDataParallel ddp(*r.model, runtime());
  r.diverge();
  r.forward(ddp);
  EXPECT_EQ(r.started_from(), after_forward_from(10.f)) << "rank " << world().rank();
}

TEST(BufferBroadcast, OffLeavesEachRankItsOwn) {
  DivergedResnet r;
  DdpOptions off;
  off.broadcast_buffers = false;
  DistributedDataParallel ddp(*r.model, runtime(), off);
  r.diverge();
  r.forward(ddp);
  EXPECT_EQ(r.started_from(), after_forward_from(10.f * static_cast<float>(world().rank() + 1)));
}

// Under Join the source is the highest rank with data (PyTorch's _find_common_rank): rank 0 may
// have run out and hold stale statistics. A joined rank takes part through join_forward().
TEST(BufferBroadcast, UnderJoinTheSourceIsTheHighestRankWithData) {
  DivergedResnet r;
  DistributedDataParallel ddp(*r.model, runtime());
  const int last = world().size() - 1;
  r.diverge();
  ddp.set_buffer_source(last);
  r.forward(ddp);
  EXPECT_EQ(r.started_from(), after_forward_from(10.f * static_cast<float>(last + 1)));
}

// A forward under no_sync() (a micro-batch that does not end its step) leaves the next forward
// without a broadcast: once per step, at its first micro-batch, as PyTorch.
TEST(BufferBroadcast, OncePerStepNotUnderNoSync) {
  DivergedResnet r;
  DistributedDataParallel ddp(*r.model, runtime());
  {
    auto guard = ddp.no_sync();
    r.forward(ddp);  // the step's first micro-batch: broadcast
  }
  r.diverge();
  r.forward(ddp);  // the step's last: none
  EXPECT_EQ(r.started_from(), after_forward_from(10.f * static_cast<float>(world().rank() + 1)));
  r.diverge();
  r.forward(ddp);  // the next step's first: broadcast again
  EXPECT_EQ(r.started_from(), after_forward_from(10.f));
}

class Compression : public ::testing::TestWithParam<std::string> {};

TEST_P(Compression, AveragedGradientsWithinHalfPrecisionOfFloat32) {
  const int n = world().size(), rank = world().rank();
  auto exact = build_model(ModelSpec{ModelKind::kMlp, {32}}, {1, 8, 8}, 10, Device::cpu(), 9);
  auto packed = build_model(ModelSpec{ModelKind::kMlp, {32}}, {1, 8, 8}, 10, Device::cpu(), 9);
  DistributedDataParallel ddp_exact(*exact, runtime());
  DdpOptions options;
  options.comm_hook = *parse_comm_hook_kind(GetParam());
  DistributedDataParallel ddp_packed(*packed, runtime(), options);
  GlobalBatch g = make_global_batch(4 * n, 3);
  auto [x, y] = rows_of(g, 4 * rank, 4);
  CrossEntropyLoss l1, l2;
  l1.forward(ddp_exact.forward(x), y);
  ddp_exact.backward(l1.backward());
  l2.forward(ddp_packed.forward(x), y);
  ddp_packed.backward(l2.backward());
  // bf16 keeps 8 significant bits (relative error 2^-9 per rounding), fp16 11 bits (2^-12); the
  // pack, each partial sum and the unpack round, so allow a few units: 2e-2 and 3e-3 of the
  // largest gradient magnitude.
  const double tol = GetParam() == "bf16" ? 2e-2 : 3e-3;
  auto pe = exact->parameters(), pp = packed->parameters();
  for (size_t i = 0; i < pe.size(); ++i) {
    auto a = pe[i]->grad.to_vector(), b = pp[i]->grad.to_vector();
    float scale = 1e-6f;
    for (float v : a) scale = std::max(scale, std::abs(v));
    for (size_t j = 0; j < a.size(); ++j) ASSERT_NEAR(b[j], a[j], tol * scale) << pe[i]->name << "[" << j << "]";
  }
  EXPECT_TRUE(gradients_bitwise_equal(*packed));
  // The averages went over the wire in 16 bits and were unpacked from them: every value is
  // exactly representable in the wire type (a float32 fallback would not give that).
  const bool bf16 = GetParam() == "bf16";
  int64_t not_representable = 0, differs_from_float32 = 0;
  for (size_t i = 0; i < pe.size(); ++i) {
    auto a = pe[i]->grad.to_vector(), b = pp[i]->grad.to_vector();
    for (size_t j = 0; j < b.size(); ++j) {
      const float round_trip = bf16 ? kernels::bf16_to_float(kernels::float_to_bf16(b[j]))
                                    : kernels::fp16_to_float(kernels::float_to_fp16(b[j]));
      not_representable += std::memcmp(&round_trip, &b[j], sizeof(float)) != 0;
      differs_from_float32 += a[j] != b[j];
    }
  }
  EXPECT_EQ(not_representable, 0) << "gradients that are not " << GetParam() << " values";
  EXPECT_GT(differs_from_float32, 0) << "the " << GetParam() << " hook gave exactly the float32 averages";
}

INSTANTIATE_TEST_SUITE_P(Hooks, Compression, ::testing::Values("bf16", "fp16"));

}  // namespace
}  // namespace dtrain

namespace dtrain {
namespace {

TEST(NoSync, NestedGuardsKeepTheOuterState) {
  auto model = build_model(ModelSpec{ModelKind::kMlp, {8}}, {1, 8, 8}, 10, Device::cpu(), 1);
  DistributedDataParallel ddp(*model, runtime());
  auto [x, y] = rows_of(make_global_batch(2, 1), 0, 2);
  CrossEntropyLoss loss;
  {
    auto outer = ddp.no_sync();
    { auto inner = ddp.no_sync(); }
    loss.forward(ddp.forward(x), y);
    ddp.backward(loss.backward());
  }
  EXPECT_EQ(ddp.reducer().stats().synced_backwards, 0);
}

// Throws from backward after its layers' hooks have launched buckets (on every rank alike).
class ThrowsAfterHooks : public Module {
 public:
  explicit ThrowsAfterHooks(std::unique_ptr<Sequential> inner) : inner_(std::move(inner)) {}
  Tensor forward(const Tensor& x) override { return inner_->forward(x); }
  Tensor backward(const Tensor& g, bool need) override {
    Tensor r = inner_->backward(g, need);
    if (throw_next_) {
      throw_next_ = false;
      throw Error("injected failure after the gradient hooks");
    }
    return r;
  }
  std::vector<Parameter*> parameters() override { return inner_->parameters(); }
  void set_grad_ready_hook(GradReadyHook hook) override { inner_->set_grad_ready_hook(std::move(hook)); }
  std::string describe() const override { return "ThrowsAfterHooks"; }
  bool throw_next_ = true;

 private:
  std::unique_ptr<Sequential> inner_;
};

TEST(FailedBackward, LaunchedAllReducesFinishAndTheNextBackwardWorks) {
  ThrowsAfterHooks model(build_model(ModelSpec{ModelKind::kMlp, {16}}, {1, 8, 8}, 10, Device::cpu(), 2));
  DdpOptions options;
  options.bucket_cap_bytes = options.first_bucket_bytes = 512;  // several buckets in flight
  DistributedDataParallel ddp(model, runtime(), options);
  ASSERT_GE(ddp.reducer().buckets().size(), 2u);
  auto [x, y] = rows_of(make_global_batch(2 * world().size(), 4), 2 * world().rank(), 2);
  CrossEntropyLoss loss;
  loss.forward(ddp.forward(x), y);
  EXPECT_THROW(ddp.backward(loss.backward()), Error);
  for (const GradBucket& b : ddp.reducer().buckets()) EXPECT_FALSE(b.work) << "bucket " << b.index << " in flight";
  loss.forward(ddp.forward(x), y);
  ddp.backward(loss.backward());  // "still in flight" before the fix
  EXPECT_TRUE(gradients_bitwise_equal(model));
}

}  // namespace
}  // namespace dtrain
