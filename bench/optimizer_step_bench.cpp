// The optimizer step over the flat store (Note [Flat store] in model/flat_store.h) against one
// optimizer per parameter (the launches of the per-parameter step it replaced, same arithmetic:
// tests/unit/model/flat_store_test.cpp checks the bits agree): kernel launches and milliseconds
// per step, for the seed MLP (784-256-10) and the 53.6 M-parameter MLP (--hidden
// 4096,4096,4096,4096), AdamW and SGD with momentum. On the device the build targets (CPU here;
// with --device cuda on a GPU build) with a synchronisation after each step.
//   build/bench/dtrain_optimizer_step_bench [--device cuda] [--steps 20]
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/stream.h"
#include "model/models.h"
#include "model/optimizer.h"

namespace dtrain {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void fill_grads(Sequential& model) {
  for (Parameter* p : model.parameters()) {
    std::vector<float> g(static_cast<size_t>(p->value.numel()));
    for (size_t i = 0; i < g.size(); ++i) g[i] = 1e-3f * static_cast<float>(static_cast<int>(i % 17) - 8);
    p->grad.copy_from(Tensor::from_vector(g, p->value.shape(), p->value.device()));
    p->grad_is_zero = false;
  }
}

void run(const std::vector<int64_t>& hidden, OptimizerKind kind, Device device, int steps) {
  ModelSpec spec;
  spec.hidden = hidden;
  OptimizerSpec o;
  o.kind = kind;
  o.lr = 1e-3f;
  o.weight_decay = 0.01f;
  std::unique_ptr<Sequential> fused_model = build_model(spec, {1, 28, 28}, 10, device, 1);
  std::unique_ptr<Sequential> split_model = build_model(spec, {1, 28, 28}, 10, device, 1);
  int64_t n = 0;
  for (Parameter* p : fused_model->parameters()) n += p->value.numel();
  fill_grads(*fused_model);
  fill_grads(*split_model);
  std::unique_ptr<Optimizer> fused = make_optimizer(o, fused_model->parameters());
  std::vector<std::unique_ptr<Optimizer>> split;
  for (Parameter* p : split_model->parameters()) split.push_back(make_optimizer(o, {p}));
  Stream& stream = compute_stream(device);
  auto time = [&](auto&& step) {
    std::vector<double> ms;
    for (int s = 0; s < steps + 2; ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      step();
      stream.synchronize();
      const double d = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (s >= 2) ms.push_back(d);  // after a warm-up
    }
    return median(ms);
  };
  const int64_t f0 = fused->launches();
  const double fused_ms = time([&] { fused->step(); });
  const double fused_launches = static_cast<double>(fused->launches() - f0) / (steps + 2);
  int64_t s0 = 0;
  for (auto& opt : split) s0 += opt->launches();
  const double split_ms = time([&] {
    for (auto& opt : split) opt->step();
  });
  int64_t s1 = 0;
  for (auto& opt : split) s1 += opt->launches();
  // The same bits either way (the unit test checks it; a figure without it would mislead).
  bool same = true;
  const auto a = fused_model->parameters(), b = split_model->parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    const std::vector<float> x = a[i]->value.to_vector(), y = b[i]->value.to_vector();
    same = same && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
  }
  fmt::print("mlp {} ({} parameters) {} on {}: per-parameter step {:.0f} launches {:.3f} ms; flat store {:.0f} launch(es) "
             "{:.3f} ms; same parameters: {}\n",
             fmt::join(hidden, ","), n, optimizer_name(kind), device.str(),
             static_cast<double>(s1 - s0) / (steps + 2), split_ms, fused_launches, fused_ms, same ? "yes" : "NO");
}

}  // namespace
}  // namespace dtrain

int main(int argc, char** argv) {
  using namespace dtrain;
  Device device = Device::cpu();
  int steps = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--device") device = std::string(argv[i + 1]) == "cuda" ? Device::cuda(0) : Device::cpu();
    if (flag == "--steps") steps = std::max(1, std::atoi(argv[i + 1]));
  }
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kSgd}) {
    run({256}, kind, device, steps);
    run({4096, 4096, 4096, 4096}, kind, device, steps);
  }
  return 0;
}
