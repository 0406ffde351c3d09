// Join at np 2 and 3: ranks with different numbers of batches (1, 2 and 5 more per rank) all
// finish, every replica stays bitwise equal, and the final weights equal, to the bit, a
// reference computed in one process with the same semantics: at each step the gradient is the
// sum over the ranks that still have a batch of their batch-mean gradient, divided by the world
// size (PyTorch's divide_by_initial_world_size), summed in rank order as the all-reduce does.
#include <cstring>
#include <random>

#include <gtest/gtest.h>

#include "core/ops.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/join.h"
#include "model/loss.h"
#include "model/models.h"
#include "model/optimizer.h"
#include "tests/mpi/mpi_test_env.h"

namespace dtrain {
namespace {

Communicator& world() { return testing::test_comm(); }

constexpr int64_t kBatch = 4;
const ModelSpec kSpec{ModelKind::kMlp, {16}};

// Rank r's batch number s: the same on every process that asks.
std::pair<Tensor, Tensor> batch_of(int rank, int64_t step) {
  std::mt19937 gen(static_cast<uint32_t>(1000 * rank + step));
  std::uniform_real_distribution<float> px(0.f, 1.f);
  std::vector<float> images(kBatch * 64);
  for (float& v : images) v = px(gen);
  Tensor y = Tensor::empty({kBatch}, Device::cpu(), DType::kI32);
  for (int64_t i = 0; i < kBatch; ++i) y.data_as<int32_t>()[i] = static_cast<int32_t>(gen() % 10);
  return {Tensor::from_vector(images, {kBatch, 1, 8, 8}), y};
}

std::vector<float> flat(Module& m, Tensor Parameter::*field = &Parameter::value) {
  std::vector<float> out;
  for (Parameter* p : m.parameters()) {
    auto v = (p->*field).to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

int64_t batches_of(int rank, int difference) { return 3 + rank * difference; }

class JoinTest : public ::testing::TestWithParam<int> {};

TEST_P(JoinTest, UnevenRanksFinishAndMatchAOneProcessReference) {
  const int difference = GetParam(), n = world().size(), rank = world().rank();
  auto model = build_model(kSpec, {1, 8, 8}, 10, Device::cpu(), 7);
  DistributedDataParallel ddp(*model, testing::test_runtime());
  Sgd opt(model->parameters(), SgdOptions{0.05f, 0.9f, 0.f, 0.f, false});
  CrossEntropyLoss loss;
  Join join(world());
  int64_t steps = 0;
  for (int64_t s = 0; join.any_rank_has_data(s < batches_of(rank, difference)); ++s, ++steps) {
    opt.zero_grad();
    if (s < batches_of(rank, difference)) {
      auto [x, y] = batch_of(rank, s);
      loss.forward(ddp.forward(x), y);
      ddp.backward(loss.backward());
    } else {
      ddp.join_backward();
    }
    opt.step();
  }
  EXPECT_EQ(steps, batches_of(n - 1, difference)) << "every rank ran until the last one ran out";
  const std::vector<float> mine = flat(*model);
  std::vector<float> all(mine.size() * static_cast<size_t>(n));
  world().allgather(mine.data(), all.data(), static_cast<int64_t>(mine.size()), DType::kF32);
  for (int r = 1; r < n; ++r)
    EXPECT_EQ(std::memcmp(all.data(), all.data() + r * mine.size(), mine.size() * sizeof(float)), 0)
        << "rank " << r << "'s replica differs from rank 0's";

  // The reference, in this process: each rank's gradient of its batch (the loss gradient scaled
  // by 1/n, as DDP scales it), summed in rank order with zeros for ranks out of data.
  auto reference = build_model(kSpec, {1, 8, 8}, 10, Device::cpu(), 7);
  auto probe = build_model(kSpec, {1, 8, 8}, 10, Device::cpu(), 7);
  Sgd ref_opt(reference->parameters(), SgdOptions{0.05f, 0.9f, 0.f, 0.f, false});
  CrossEntropyLoss probe_loss;
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<float> sum;
    for (int r = 0; r < n; ++r) {
      std::vector<float> g(mine.size(), 0.f);
      if (s < batches_of(r, difference)) {
        for (size_t i = 0; i < probe->parameters().size(); ++i) {
          probe->parameters()[i]->value.copy_from(reference->parameters()[i]->value);
          probe->parameters()[i]->grad.zero_();
        }
        auto [x, y] = batch_of(r, s);
        probe_loss.forward(probe->forward(x), y);
        Tensor grad = probe_loss.backward();
        scale(grad, 1.f / static_cast<float>(n));
        probe->backward(grad, false);
        g = flat(*probe, &Parameter::grad);
      }
      if (r == 0) {
        sum = g;
      } else {
        for (size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
      }
    }
    size_t offset = 0;
    for (Parameter* p : reference->parameters()) {
      std::memcpy(p->grad.raw(), sum.data() + offset, p->grad.nbytes());
      offset += static_cast<size_t>(p->grad.numel());
    }
    ref_opt.step();
  }
  const std::vector<float> want = flat(*reference);
  ASSERT_EQ(want.size(), mine.size());
  EXPECT_EQ(std::memcmp(mine.data(), want.data(), mine.size() * sizeof(float)), 0)
      << "the final weights differ from the one-process reference";
}

INSTANTIATE_TEST_SUITE_P(BatchesMorePerRank, JoinTest, ::testing::Values(1, 2, 5));

}  // namespace
}  // namespace dtrain
