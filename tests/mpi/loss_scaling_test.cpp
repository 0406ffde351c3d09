// fp16 loss scaling at np 2 and 3 (Note [Loss scaling]): an infinite gradient on ONE rank, after
// the all-reduce (where only that rank's check can see it), makes EVERY rank skip that step and
// halve its scale; parameters stay bitwise equal across ranks (pytorch#136009, fairscale#179).
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>

#include <gtest/gtest.h>

#include "core/kernels.h"
#include "core/ops.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/loss_scaling.h"
#include "model/loss.h"
#include "model/models.h"
#include "model/optimizer.h"
#include "tests/mpi/mpi_test_env.h"

namespace dtrain {
namespace {

Communicator& world() { return testing::test_comm(); }
Runtime& runtime() { return testing::test_runtime(); }

std::vector<float> flat_values(Module& m) {
  std::vector<float> out;
  for (Parameter* p : m.parameters()) {
    const std::vector<float> v = p->value.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

using testing::bitwise_equal_on_all_ranks;

TEST(LossScaling, AnInfOnOneRankSkipsTheStepOnEveryRank) {
  const int n = world().size(), rank = world().rank();
  constexpr int64_t kBatch = 8, kSteps = 12;
  auto model = build_model(ModelSpec{ModelKind::kMlp, {24}}, {1, 6, 6}, 5, Device::cpu(), 3);
  model->set_amp(AmpMode::kFp16);
  DistributedDataParallel ddp(*model, runtime());
  AdamW opt(model->parameters(), AdamWOptions{1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f});
  GradScalerSettings settings;
  settings.growth_interval = 3;  // growth happens too within the run
  LossScaling scaling(world(), settings, Device::cpu());
  CrossEntropyLoss loss_fn;
  // Step s is poisoned on rank s % n only; steps not listed are clean everywhere.
  const std::set<int64_t> poisoned = {2, 5, 6, 10};
  std::mt19937 gen(100 + static_cast<unsigned>(rank));  // each rank its own data
  std::uniform_real_distribution<float> px(0.f, 1.f);
  std::vector<float> scales;
  int64_t taken = 0;
  for (int64_t step = 1; step <= kSteps; ++step) {
    std::vector<float> images(kBatch * 36);
    for (float& v : images) v = px(gen);
    Tensor x = Tensor::from_vector(images, {kBatch, 1, 6, 6});
    Tensor y = Tensor::empty({kBatch}, Device::cpu(), DType::kI32);
    for (int64_t i = 0; i < kBatch; ++i) y.data_as<int32_t>()[i] = static_cast<int32_t>((step + i) % 5);
    opt.zero_grad();
    loss_fn.forward(ddp.forward(x), y);
    Tensor grad = loss_fn.backward();
    scale(grad, scaling.scale());
    ddp.backward(grad);
    // After the all-reduce, as an fp16 overflow in this rank's own step would leave it.
    if (poisoned.count(step) && step % n == rank)
      model->parameters()[1]->grad.data()[0] = std::numeric_limits<float>::infinity();
    const std::vector<float> before = flat_values(*model);
    const bool take = scaling.unscale_and_agree(written_grads(model->parameters()));
    if (take) {
      opt.step();
      ++taken;
    }
    EXPECT_EQ(take, poisoned.count(step) == 0) << "rank " << rank << " step " << step;
    if (!take) {
      EXPECT_EQ(flat_values(*model), before) << "a skipped step leaves the parameters";
    }
    ASSERT_TRUE(bitwise_equal_on_all_ranks(flat_values(*model))) << "replicas diverged at step " << step;
    scales.push_back(scaling.scale());
  }
  EXPECT_TRUE(bitwise_equal_on_all_ranks(scales)) << "every rank keeps the same scale";
  EXPECT_EQ(taken, kSteps - static_cast<int64_t>(poisoned.size()));
  EXPECT_EQ(scaling.scaler().state().skipped_steps, static_cast<int64_t>(poisoned.size()));
  // 1 ok, 2 skip, 3 4 ok, 5 6 skip, 7 8 9 ok (grow), 10 skip, 11 12 ok.
  const std::vector<float> want = {65536, 32768, 32768, 32768, 16384, 8192, 8192, 8192, 16384, 8192, 8192, 8192};
  EXPECT_EQ(scales, want);
}

}  // namespace
}  // namespace dtrain
