// A model and a dataset of your own, trained data-parallel with dtrain as an installed library:
//   mpirun -np 2 ./custom_model [--checkpoint-dir DIR [--every N] [--resume]] [--weights-out FILE]
// The data: 2-d points in two interleaved half-moons (made in memory, same on every rank). The
// model: Sequential(Linear, Tanh (a layer written here), Linear). Every rank ends with the same
// parameters, which the last line checks. With --checkpoint-dir it saves every N optimizer steps
// and at the end (in the background, atomically: train/checkpointer.h), and --resume continues
// from the newest checkpoint there, to the bit: the same final weights as a run never stopped.
#include <signal.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include <dtrain/comm/exchange.h>
#include <dtrain/comm/runtime.h>
#include <dtrain/core/exit_status.h>
#include <dtrain/data/data_loader.h>
#include <dtrain/data/distributed_sampler.h>
#include <dtrain/ddp/distributed_data_parallel.h>
#include <dtrain/model/fingerprint.h>
#include <dtrain/model/linear.h>
#include <dtrain/model/loss.h>
#include <dtrain/model/optimizer.h>
#include <dtrain/model/sequential.h>
#include <dtrain/train/checkpointer.h>
#include <dtrain/train/root_broadcast.h>

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

struct Args {
  std::string checkpoint_dir;  // empty: no checkpoints
  int64_t every = 50;          // optimizer steps between checkpoints
  bool resume = false;
  int64_t kill_at_step = 0;  // tests: rank 0 dies by SIGKILL after this step's checkpoint is written
  std::string weights_out;   // the final parameters, as a safetensors file (rank 0)
};

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw Error(flag + ": expected a value");
      return argv[++i];
    };
    auto count = [&]() {
      const std::string v = value();
      char* end = nullptr;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n <= 0) throw Error(flag + ": expected a positive whole number, got '" + v + "'");
      return static_cast<int64_t>(n);
    };
    if (flag == "--checkpoint-dir") a.checkpoint_dir = value();
    else if (flag == "--every") a.every = count();
    else if (flag == "--resume") a.resume = true;
    else if (flag == "--kill-at-step") a.kill_at_step = count();
    else if (flag == "--weights-out") a.weights_out = value();
    else throw Error("unknown option '" + flag + "'");
  }
  if ((a.resume || a.kill_at_step) && a.checkpoint_dir.empty()) throw Error("--resume and --kill-at-step need --checkpoint-dir");
  return a;
}

int train(Runtime& rt, const Args& args) {
  const int64_t epochs = 5;
  InitRng rng(42);
  Sequential model;
  model.emplace<Linear>(2, 32, rt.device(), rng).emplace<Tanh>().emplace<Linear>(32, 2, rt.device(), rng);
  DistributedDataParallel ddp(model, rt);  // checks the ranks agree, broadcasts rank 0's weights
  Sgd sgd(model.parameters(), SgdOptions{.lr = 0.1f, .momentum = 0.9f});
  Moons data;
  DistributedSampler sampler(data.size(), rt.size(), rt.rank(), /*shuffle=*/true, /*seed=*/0);
  DataLoader loader(data, 32);
  CrossEntropyLoss loss_fn;

  // Where the run stands; a checkpoint stores it with the weights and the momentum buffers.
  // `config` holds what a resumed run must share: another value is refused in one line.
  checkpoint::TrainingState at;
  at.world_size = rt.size();
  at.config = {{"lr", 0.1}, {"momentum", 0.9}, {"batch_size", 32}, {"epochs", epochs}};
  std::optional<Checkpointer> ckpt;
  if (!args.checkpoint_dir.empty()) ckpt.emplace(rt.control(), CheckpointerOptions{.dir = args.checkpoint_dir});
  if (args.resume) {
    if (std::optional<Resumed> resumed = ckpt->restore_latest(model, sgd, at.config)) {
      at = resumed->state;
      at.world_size = rt.size();  // a resume at another world size records the new one
      if (rt.rank() == 0) std::printf("resumed from %s (step %lld)\n", resumed->path.c_str(), static_cast<long long>(at.global_step));
    } else if (rt.rank() == 0) {
      std::printf("no checkpoint in %s: starting fresh\n", args.checkpoint_dir.c_str());
    }
  }

  float loss = 0;
  for (; at.epoch < epochs; ++at.epoch, at.sample_in_epoch = 0) {
    sampler.set_epoch(at.epoch);
    loader.start_epoch(sampler.indices_from(at.sample_in_epoch));  // the rest of the epoch
    for (Batch batch; loader.next(batch);) {
      sgd.zero_grad();
      loss = loss_value(loss_fn.forward(ddp.forward(batch.images), batch.labels));
      ddp.backward(loss_fn.backward());  // gradients averaged over ranks, bucket by bucket
      sgd.step();
      ++at.global_step;
      at.sample_in_epoch += batch.size * rt.size();
      if (ckpt && at.global_step % args.every == 0) ckpt->save(at, model, sgd);  // returns once copied
      if (at.global_step == args.kill_at_step) {
        ckpt->finish();  // the checkpoint is on disk; then a rank dies as a lost node would
        if (rt.rank() == 0) raise(SIGKILL);
      }
    }
    if (rt.rank() == 0) std::printf("epoch %lld: loss %.4f\n", static_cast<long long>(at.epoch + 1), loss);
  }
  if (ckpt) {
    ckpt->save(at, model, sgd);
    ckpt->finish();  // a failed save is every rank's error
  }
  if (!args.weights_out.empty() && rt.rank() == 0) {
    std::vector<safetensors::HostTensor> weights;
    for (Parameter* p : model.parameters()) weights.push_back(safetensors::host_copy(p->name, p->value));
    const std::vector<safetensors::TensorRef> refs = safetensors::refs(weights);
    safetensors::write_file(args.weights_out, refs);
  }
  const std::vector<uint64_t> all = allgather_values(rt.control(), parameters_fingerprint(model));
  bool same = true;
  for (uint64_t f : all) same = same && f == all[0];
  if (rt.rank() == 0) std::printf("%d ranks, parameters %s on every rank\n", rt.size(), same ? "identical" : "DIFFERENT");
  return same && loss < 0.3f ? 0 : 1;
}

int main(int argc, char** argv) {
  std::unique_ptr<Runtime> rt = init(&argc, &argv, RuntimeOptions{.device = DeviceRequest::cpu()});
  try {
    return train(*rt, parse_args(argc, argv));
  } catch (const AgreedError& e) {  // every rank stops alike (a checkpoint that does not fit); rank 0 says why
    if (rt->rank() == 0) std::fprintf(stderr, "custom_model: error: %s\n", e.what());
    return exit_status(e.kind());  // 66 for a damaged checkpoint: dtrain-launch will not retry it
  } catch (const Error& e) {  // a bad flag: the same on every rank
    if (rt->rank() == 0) std::fprintf(stderr, "custom_model: error: %s\n", e.what());
    return 2;
  }
}
