// A model and a dataset of your own, trained data-parallel with dtrain as an installed library:
//   mpirun -np 2 ./custom_model
// The data: 2-d points in two interleaved half-moons (made in memory, same on every rank). The
// model: Sequential(Linear, Tanh (a layer written here), Linear). Every rank ends with the same
// parameters, which the last line checks.
#include <cmath>
#include <cstdio>

#include <dtrain/comm/exchange.h>
#include <dtrain/comm/runtime.h>
#include <dtrain/data/data_loader.h>
#include <dtrain/data/distributed_sampler.h>
#include <dtrain/ddp/distributed_data_parallel.h>
#include <dtrain/model/fingerprint.h>
#include <dtrain/model/linear.h>
#include <dtrain/model/loss.h>
#include <dtrain/model/optimizer.h>
#include <dtrain/model/sequential.h>

using namespace dtrain;

// A dataset is size, sample shape, classes, and get(): write sample i, return its label.
class Moons : public Dataset {
 public:
  int64_t size() const override { return 4096; }
  Shape sample_shape() const override { return {2}; }
  int num_classes() const override { return 2; }
  int32_t get(int64_t i, float* out) const override {
    const int32_t label = static_cast<int32_t>(i % 2);
    const float t = 3.14159f * static_cast<float>(i / 2) / static_cast<float>(size() / 2);
    const float noise = 0.1f * std::sin(37.f * static_cast<float>(i));  // deterministic jitter
    out[0] = label ? 1.f - std::cos(t) : std::cos(t);
    out[1] = (label ? 0.5f - std::sin(t) : std::sin(t)) + noise;
    return label;
  }
};

// A layer without parameters; one with them declares Parameter members, returns them from
// parameters(), and calls grad_ready(p) in backward (Note [Writing a layer] in model/module.h).
class Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) override {
    ensure_tensor(y_, x.shape(), x.device());
    for (int64_t i = 0; i < x.numel(); ++i) y_.data()[i] = std::tanh(x.data()[i]);
    return y_;
  }
  Tensor backward(const Tensor& dy, bool need_input_grad) override {
    if (!need_input_grad) return {};
    ensure_tensor(dx_, dy.shape(), dy.device());
    for (int64_t i = 0; i < dy.numel(); ++i) dx_.data()[i] = dy.data()[i] * (1.f - y_.data()[i] * y_.data()[i]);
    return dx_;
  }
  std::string describe() const override { return "Tanh()"; }

 private:
  Tensor y_, dx_;
};

int main(int argc, char** argv) {
  std::unique_ptr<Runtime> rt = init(&argc, &argv, RuntimeOptions{.device = DeviceRequest::cpu()});
  InitRng rng(42);
  Sequential model;
  model.emplace<Linear>(2, 32, rt->device(), rng).emplace<Tanh>().emplace<Linear>(32, 2, rt->device(), rng);
  DistributedDataParallel ddp(model, *rt);  // checks the ranks agree, broadcasts rank 0's weights
  Sgd sgd(model.parameters(), SgdOptions{.lr = 0.1f, .momentum = 0.9f});
  Moons data;
  DistributedSampler sampler(data.size(), rt->size(), rt->rank(), /*shuffle=*/true, /*seed=*/0);
  DataLoader loader(data, 32);
  CrossEntropyLoss loss_fn;
  float loss = 0;
  for (int64_t epoch = 0; epoch < 5; ++epoch) {
    sampler.set_epoch(epoch);
    loader.start_epoch(sampler.indices());
    for (Batch batch; loader.next(batch);) {
      sgd.zero_grad();
      loss = loss_value(loss_fn.forward(ddp.forward(batch.images), batch.labels));
      ddp.backward(loss_fn.backward());  // gradients averaged over ranks, bucket by bucket
      sgd.step();
    }
    if (rt->rank() == 0) std::printf("epoch %lld: loss %.4f\n", static_cast<long long>(epoch + 1), loss);
  }
  const std::vector<uint64_t> all = allgather_values(rt->control(), parameters_fingerprint(model));
  bool same = true;
  for (uint64_t f : all) same = same && f == all[0];
  if (rt->rank() == 0) std::printf("%d ranks, parameters %s on every rank\n", rt->size(), same ? "identical" : "DIFFERENT");
  return same && loss < 0.3f ? 0 : 1;
}
