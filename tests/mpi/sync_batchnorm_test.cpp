// SyncBatchNorm on a communicator of its own (Note [SyncBatchNorm beside the buckets] in
// ddp/distributed_data_parallel.cpp), at np 2, 3 and 4 with MPI_THREAD_MULTIPLE: the statistics'
// collectives do not queue behind the gradient communicator's, and the training is the same bit
// for bit as with the statistics on the gradient communicator.
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "ddp/distributed_data_parallel.h"
#include "model/loss.h"
#include "model/models.h"
#include "model/optimizer.h"
#include "tests/mpi/mpi_test_env.h"

namespace dtrain {
namespace {

Runtime& runtime() { return testing::test_runtime(); }

// A resnet18 of width 2 on 8x8 images: 20 BatchNorms, two collectives each per step.
std::unique_ptr<Module> small_resnet() {
  ModelSpec spec;
  spec.kind = ModelKind::kResnet18;
  spec.width = 2;
  return build_model(spec, {1, 8, 8}, 10, Device::cpu(), 11);
}

// This rank's `rows` images and labels, different on every rank and every step.
std::pair<Tensor, Tensor> batch(int64_t rows, int step) {
  std::mt19937 gen(static_cast<uint32_t>(1000 * step + runtime().rank()));
  std::uniform_real_distribution<float> px(0.f, 1.f);
  std::vector<float> images(static_cast<size_t>(rows * 64));
  for (float& v : images) v = px(gen);
  Tensor y = Tensor::empty({rows}, Device::cpu(), DType::kI32);
  for (int64_t i = 0; i < rows; ++i) static_cast<int32_t*>(y.raw())[i] = static_cast<int32_t>(gen() % 10);
  return {Tensor::from_vector(images, {rows, 1, 8, 8}), y};
}

// Every parameter and float buffer after `steps` SGD steps with SyncBatchNorm.
std::vector<float> trained_state(bool own_communicator, int steps) {
  auto model = small_resnet();
  DdpOptions options;
  options.sync_batchnorm = true;
  options.sync_batchnorm_own_communicator = own_communicator;
  DistributedDataParallel ddp(*model, runtime(), options);
  EXPECT_EQ(ddp.batch_stats_communicator() != nullptr, own_communicator);
  Sgd sgd(model->parameters(), SgdOptions{0.05f, 0.9f, 0.f, 1e-4f, false});
  CrossEntropyLoss loss;
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = batch(4, s);
    sgd.zero_grad();
    loss.forward(ddp.forward(x), y);
    ddp.backward(loss.backward());
    sgd.step();
  }
  std::vector<float> out;
  for (Parameter* p : model->parameters()) {
    const auto v = p->value.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  for (Buffer* b : model->buffers())
    if (b->value.dtype() == DType::kF32) {
      const auto v = b->value.to_vector();
      out.insert(out.end(), v.begin(), v.end());
    }
  return out;
}

// The same collectives with the same operands in the same order, only on another communicator:
// the same bits.
TEST(SyncBatchNorm, OnItsOwnCommunicatorTrainsTheSameBitsAsOnTheGradientCommunicator) {
  const std::vector<float> own = trained_state(true, 3);
  const std::vector<float> shared = trained_state(false, 3);
  ASSERT_EQ(own.size(), shared.size());
  EXPECT_EQ(std::memcmp(own.data(), shared.data(), own.size() * sizeof(float)), 0);
  EXPECT_TRUE(testing::bitwise_equal_on_all_ranks(own));
}

// Rank 0 issues a collective on the gradient communicator before its training forward, the
// other ranks after theirs: the forward's 40 statistics collectives must complete meanwhile.
// On one queue with the gradients' (the mutant in tests/README.md), rank 0's first statistics
// gather would wait behind its all-reduce, which meets the other ranks' first gather: the
// collective check fails both ("ranks issued different collectives").
TEST(SyncBatchNorm, StatisticsDoNotWaitBehindTheGradientCommunicatorsCollectives) {
  auto model = small_resnet();
  DdpOptions options;
  options.sync_batchnorm = true;
  options.sync_batchnorm_own_communicator = true;
  DistributedDataParallel ddp(*model, runtime(), options);
  ASSERT_NE(ddp.batch_stats_communicator(), nullptr);
  auto [x, y] = batch(4, 0);
  Communicator& gradients = runtime().gradients();
  float held[4] = {1.f, 1.f, 1.f, 1.f};
  const bool first = runtime().rank() == 0;
  WorkHandle pending;
  if (first) pending = gradients.allreduce_async(held, 4, DType::kF32, ReduceOp::kSum);
  // The module's own forward: DDP's would first broadcast the buffers on the gradient communicator.
  model->set_training(true);
  const Tensor logits = model->forward(x);
  if (!first) pending = gradients.allreduce_async(held, 4, DType::kF32, ReduceOp::kSum);
  pending->wait();
  EXPECT_EQ(held[0], static_cast<float>(runtime().size()));
  EXPECT_EQ(logits.numel(), 40);
}

}  // namespace
}  // namespace dtrain
