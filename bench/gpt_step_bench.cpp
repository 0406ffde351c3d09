// Forward + backward of the GPT (model/gpt.h) at the CPU configuration (L4 H4 C256 T256,
// batch 8, vocabulary 256) on one thread, in thread CPU time (steadier than the wall clock on a
// shared machine), beside this binary's own sgemm rate (1024^3, best before and after) and the time of the non-GEMM
// layers alone (LayerNorm, GELU, embedding) so the elementwise share is visible, and a checksum
// of the last step's loss and gradients (FNV-1a of their bits) so a change that should keep the
// floats can be seen to keep them.
//   build/bench/dtrain_gpt_step_bench [--layers 4 --heads 4 --embd 256 --context 256 --batch 8 --vocab 256 --steps 5]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <sys/resource.h>
#include <string>
#include <vector>

#include "core/ops.h"
#include "model/activation.h"
#include "model/gpt.h"
#include "model/loss.h"

namespace {

double thread_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

template <class F>
double best_of(int reps, F&& f) {  // seconds, best of reps (the least disturbed run)
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const double t0 = thread_seconds();
    f();
    best = std::min(best, thread_seconds() - t0);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dtrain;
  GptSpec spec{256, 256, 4, 4, 256};
  int64_t batch = 8;
  int steps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int64_t v = std::atoll(argv[i + 1]);
    if (k == "--layers") spec.layers = v;
    else if (k == "--heads") spec.heads = v;
    else if (k == "--embd") spec.embd = v;
    else if (k == "--context") spec.context = v;
    else if (k == "--vocab") spec.vocab = v;
    else if (k == "--batch") batch = v;
    else if (k == "--steps") steps = static_cast<int>(v);
    else {
      std::fprintf(stderr, "dtrain: error: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  set_cpu_threads(1);
  const Device cpu = Device::cpu();

  // sgemm ceiling of this binary, one thread.
  const int64_t n = 1024;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  auto sgemm_rate = [&] {  // best of 5: one disturbed product would understate the ceiling
    return 2.0 * n * n * n / best_of(5, [&] { gemm(cpu, false, false, n, n, n, 1.f, a.data(), b.data(), 0.f, c.data()); });
  };
  double sgemm = sgemm_rate();

  auto model = build_gpt(spec, cpu, 1);
  const int64_t T = spec.context, C = spec.embd, rows = batch * T;
  Tensor tokens = Tensor::empty({batch, T}, cpu, DType::kI32), targets = Tensor::empty({rows}, cpu, DType::kI32);
  for (int64_t i = 0; i < rows; ++i) {
    tokens.data_as<int32_t>()[i] = static_cast<int32_t>((i * 131) % spec.vocab);
    targets.data_as<int32_t>()[i] = static_cast<int32_t>((i * 131 + 7) % spec.vocab);
  }
  CrossEntropyLoss loss;
  double fwd = 1e30, bwd = 1e30, lossf = 0, first = 0;
  uint64_t checksum = 14695981039346656037ull;  // FNV-1a over the last step's loss and gradients' bits
  const auto hash = [&](const float* p, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      uint32_t bits = 0;
      std::memcpy(&bits, p + i, sizeof bits);
      checksum = (checksum ^ bits) * 1099511628211ull;
    }
  };
  for (int s = 0; s < steps + 1; ++s) {  // the first is warm-up (buffers allocated)
    const double t0 = thread_seconds();
    Tensor logits = model->forward(tokens);
    const double t1 = thread_seconds();
    loss.forward(logits, targets);
    const double t2 = thread_seconds();
    model->backward(loss.backward());
    const double t3 = thread_seconds();
    if (s == steps) {
      const Tensor l = loss.forward(logits, targets);
      hash(l.to_vector().data(), 1);
      for (Parameter* p : model->parameters()) hash(p->grad.to_vector().data(), p->grad.numel());
    }
    if (s == 0) first = t3 - t0;  // with the first touch of every buffer's pages
    if (s > 0) {
      fwd = std::min(fwd, t1 - t0);
      lossf = t2 - t1;
      bwd = std::min(bwd, t3 - t2);
    }
  }
  // Model FLOPs per token as nanoGPT/PaLM count them: 6 x (weights incl. the tied wte, not wpe)
  // + 12 L T C for attention's two products (causal half not subtracted).
  const int64_t params = gpt_parameter_count(spec) - spec.context * C;
  const double flop_token = 6.0 * static_cast<double>(params) + 12.0 * spec.layers * T * C;
  const double step = fwd + lossf + bwd;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const double peak_mib = static_cast<double>(usage.ru_maxrss) / 1024;  // the model's step, before the layers below

  // The non-GEMM layers on their own, at the model's shapes: per step 2L+1 LayerNorms (C wide),
  // L GELUs (4C wide), one embedding.
  LayerNorm ln(C, cpu);
  GELU gelu;
  TokenEmbedding emb(spec.vocab, T, C, cpu);
  Tensor x = Tensor::zeros({batch, T, C}, cpu), h = Tensor::zeros({rows, 4 * C}, cpu);
  const double ln_s = best_of(3, [&] {
    ln.forward(x);
    ln.backward_add(x, x);
  });
  const double gelu_s = best_of(3, [&] {
    gelu.forward(h);
    gelu.backward(h);
  });
  const double emb_s = best_of(3, [&] {
    emb.forward(tokens);
    emb.backward(x);
  });
  const double elementwise = (2 * spec.layers + 1) * ln_s + spec.layers * gelu_s + emb_s;
  sgemm = std::max(sgemm, sgemm_rate());  // measured before and after the model: the better

  std::printf(
      "gpt L%lld H%lld C%lld T%lld V%lld B%lld, 1 thread (thread CPU time, best of %d):\n"
      "  forward %.1f ms, loss %.1f ms, backward %.1f ms, step %.1f ms = %.0f tokens/s\n"
      "  first step %.1f ms (buffers allocated, their pages touched); peak RSS %.0f MiB\n"
      "  %.2f MFLOP/token -> %.1f GFLOP/s = %.2f of this binary's sgemm (%.1f GFLOP/s, 1024^3)\n"
      "  non-GEMM layers: LayerNorm fwd+bwd %.2f ms x %lld, GELU fwd+bwd %.2f ms x %lld, embedding %.2f ms: %.1f ms "
      "(%.0f%% of the step)\n"
      "  checksum of the last step's loss and gradients: %016llx\n",
      (long long)spec.layers, (long long)spec.heads, (long long)C, (long long)T, (long long)spec.vocab,
      (long long)batch, steps, 1e3 * fwd, 1e3 * lossf, 1e3 * bwd, 1e3 * step, rows / step, 1e3 * first, peak_mib, flop_token / 1e6,
      flop_token * rows / step / 1e9, flop_token * rows / step / sgemm, sgemm / 1e9, 1e3 * ln_s,
      (long long)(2 * spec.layers + 1), 1e3 * gelu_s, (long long)spec.layers, 1e3 * emb_s, 1e3 * elementwise,
      100 * elementwise / step, (unsigned long long)checksum);
  return 0;
}
