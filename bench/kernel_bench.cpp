// Kernel micro-benchmarks (Google Benchmark) for the CPU training step: the GEMM shapes of the
// MLP and the CNN, im2col/col2im, convolution forward/backward, max pooling, and whole training
// steps. Every figure comes with the fraction of this machine's ceiling, measured at start-up in
// the same binary (sgemm on 1024^3 for compute, a 64 MiB copy for memory), and with a
// correctness count (`wrong`: elements off the reference; a benchmark with any is an error).
//   build-cpu/bench/dtrain_kernel_bench [--benchmark_filter=Conv] [--benchmark_repetitions=5]
// Run it with OPENBLAS_NUM_THREADS=1 for the per-rank figures of the 1-thread jobs.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <ctime>
#include <cmath>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "core/ops.h"
#include "model/activation.h"
#include "model/conv.h"
#include "model/cpu_conv.h"
#include "model/loss.h"
#include "model/models.h"
#include "model/optimizer.h"

namespace dtrain {
namespace {

struct Ceiling {
  double flops = 0;  // sgemm FLOP/s, best of a few 1024^3 products
  double bytes = 0;  // memory bytes/s (read + written) of a 64 MiB copy
};
Ceiling g_ceiling;

// Seconds of CPU time of this thread: what Google Benchmark's rates divide by too, and steadier
// than the wall clock on a machine shared with other jobs.
double thread_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

template <class F>
double best_seconds(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = thread_seconds();
    f();
    best = std::min(best, thread_seconds() - t0);
  }
  return best;
}

Ceiling measure_ceiling() {
  const int64_t n = 1024;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  const double t_gemm = best_seconds(4, [&] {
    gemm(Device::cpu(), false, false, n, n, n, 1.f, a.data(), b.data(), 0.f, c.data());
  });
  std::vector<float> src(size_t{16} << 20, 1.f), dst(src.size());
  const double t_copy = best_seconds(5, [&] { std::memcpy(dst.data(), src.data(), src.size() * sizeof(float)); });
  benchmark::DoNotOptimize(c.data());
  benchmark::DoNotOptimize(dst.data());
  return {2.0 * n * n * n / t_gemm, 2.0 * static_cast<double>(src.size() * sizeof(float)) / t_copy};
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (float& f : v) {
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>(x >> 8) / 8388608.f - 1.f;  // [-1, 1)
  }
  return v;
}

// Times the benchmark loop in thread CPU time, so that the fractions of the ceiling can be plain
// counters (a rate counter would print them as "per second").
class LoopClock {
 public:
  LoopClock() : t0_(thread_seconds()) {}
  double seconds() const { return thread_seconds() - t0_; }

 private:
  double t0_;
};

// FLOP/s and bytes/s per iteration, each with its fraction of the machine's ceiling; `wrong` as
// given (a benchmark with wrong elements is reported as an error).
void report(benchmark::State& state, const LoopClock& clock, double flops, double bytes, int64_t wrong) {
  using benchmark::Counter;
  const double seconds = clock.seconds(), iters = static_cast<double>(state.iterations());
  if (flops > 0) {
    state.counters["GFLOP/s"] = flops * iters / seconds / 1e9;
    state.counters["of_sgemm_peak"] = flops * iters / seconds / g_ceiling.flops;
  }
  if (bytes > 0) {
    state.counters["GB/s"] = bytes * iters / seconds / 1e9;
    state.counters["of_mem_bw"] = bytes * iters / seconds / g_ceiling.bytes;
  }
  state.counters["wrong"] = static_cast<double>(wrong);
  if (wrong > 0) state.SkipWithError(fmt::format("{} elements off the reference", wrong).c_str());
}

int64_t count_off(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  int64_t off = 0;
  for (size_t i = 0; i < got.size(); ++i) off += !(std::abs(got[i] - want[i]) <= tol * (1.0 + std::abs(want[i])));
  return off;
}

// ---- GEMM: the shapes the models run (row-major, as core/ops.h) ----

void BM_Gemm(benchmark::State& state, bool ta, bool tb, int64_t m, int64_t n, int64_t k) {
  const std::vector<float> a = random_floats(static_cast<size_t>(m * k), 1), b = random_floats(static_cast<size_t>(k * n), 2);
  std::vector<float> c(static_cast<size_t>(m * n));
  gemm(Device::cpu(), ta, tb, m, n, k, 1.f, a.data(), b.data(), 0.f, c.data());
  std::vector<double> want(c.size());  // a few rows against a double-precision product
  for (int64_t i = 0; i < std::min<int64_t>(m, 4); ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += double(a[ta ? p * m + i : i * k + p]) * b[tb ? j * k + p : p * n + j];
      want[static_cast<size_t>(i * n + j)] = s;
    }
  std::vector<float> head(c.begin(), c.begin() + std::min<int64_t>(m, 4) * n);
  want.resize(head.size());
  const int64_t wrong = count_off(head, want, 1e-4);
  const LoopClock clock;
  for (auto _ : state) {
    gemm(Device::cpu(), ta, tb, m, n, k, 1.f, a.data(), b.data(), 0.f, c.data());
    benchmark::DoNotOptimize(c.data());
  }
  report(state, clock, 2.0 * m * n * k, 0, wrong);
}
// MLP 784-256-10, batch 64: forward x W^T, dW = dY^T X, and the output layer's three.
BENCHMARK_CAPTURE(BM_Gemm, mlp_fc1_fwd_64x256x784, false, true, 64, 256, 784);
BENCHMARK_CAPTURE(BM_Gemm, mlp_fc1_dW_256x784x64, true, false, 256, 784, 64);
BENCHMARK_CAPTURE(BM_Gemm, mlp_fc2_fwd_64x10x256, false, true, 64, 10, 256);
BENCHMARK_CAPTURE(BM_Gemm, mlp_fc2_dW_10x256x64, true, false, 10, 256, 64);
BENCHMARK_CAPTURE(BM_Gemm, mlp_fc2_dX_64x256x10, false, false, 64, 256, 10);
BENCHMARK_CAPTURE(BM_Gemm, mlp2048_fc1_fwd_64x2048x784, false, true, 64, 2048, 784);
// CNN: the convolutions' GEMMs over the whole batch (forward, dW, dcols), and its first Linear.
BENCHMARK_CAPTURE(BM_Gemm, conv1_fwd_6x50176x25, false, false, 6, 50176, 25);
BENCHMARK_CAPTURE(BM_Gemm, conv1_dW_6x25x50176, false, true, 6, 25, 50176);
BENCHMARK_CAPTURE(BM_Gemm, conv2_fwd_16x6400x150, false, false, 16, 6400, 150);
BENCHMARK_CAPTURE(BM_Gemm, conv2_dW_16x150x6400, false, true, 16, 150, 6400);
BENCHMARK_CAPTURE(BM_Gemm, conv2_dcols_150x6400x16, true, false, 150, 6400, 16);
BENCHMARK_CAPTURE(BM_Gemm, cnn_fc1_fwd_64x120x400, false, true, 64, 120, 400);
// ResNet-18 width 16: one image of layer1 (16 channels, 3x3, 28x28: the chunk the CPU's Conv2d
// runs, Note [Chunked CPU convolution]) as Conv2d multiplies, and each product transposed
// (C^T = B^T A^T: the same sums, the other operand as the library's packed A).
BENCHMARK_CAPTURE(BM_Gemm, resnet_l1_fwd_16x784x144, false, false, 16, 784, 144);
BENCHMARK_CAPTURE(BM_Gemm, resnet_l1_fwd_T_784x16x144, true, true, 784, 16, 144);
BENCHMARK_CAPTURE(BM_Gemm, resnet_l1_dW_16x144x784, false, true, 16, 144, 784);
BENCHMARK_CAPTURE(BM_Gemm, resnet_l1_dW_T_144x16x784, false, true, 144, 16, 784);
BENCHMARK_CAPTURE(BM_Gemm, resnet_l1_dcols_144x784x16, true, false, 144, 784, 16);
BENCHMARK_CAPTURE(BM_Gemm, resnet_l1_dcols_T_784x144x16, true, false, 784, 144, 16);
// layer3 (64 channels, 7x7: chunks of 4 images) and layer4 (128, 4x4: chunks of 7), dW both ways.
BENCHMARK_CAPTURE(BM_Gemm, resnet_l3_dW_64x576x196, false, true, 64, 576, 196);
BENCHMARK_CAPTURE(BM_Gemm, resnet_l3_dW_T_576x64x196, false, true, 576, 64, 196);
BENCHMARK_CAPTURE(BM_Gemm, resnet_l4_dW_128x1152x112, false, true, 128, 1152, 112);
BENCHMARK_CAPTURE(BM_Gemm, resnet_l4_dW_T_1152x128x112, false, true, 1152, 128, 112);

// ---- im2col / col2im / pooling: the CPU loops, and the functors they replace ----

struct ConvShape {
  int64_t batch, c, hw, k, pad;
  kernels::ConvGeometry geometry() const {
    const int64_t o = hw + 2 * pad - k + 1;
    return {c, hw, hw, k, k, 1, pad, o, o};
  }
};
const ConvShape kConv1{64, 1, 28, 5, 2}, kConv2{64, 6, 14, 5, 0};

void BM_Im2col(benchmark::State& state, ConvShape s, bool reference) {
  const kernels::ConvGeometry g = s.geometry();
  const std::vector<float> x = random_floats(static_cast<size_t>(s.batch * s.c * s.hw * s.hw), 3);
  const int64_t n = s.c * s.k * s.k * s.batch * g.oh * g.ow;
  std::vector<float> col(static_cast<size_t>(n)), want(static_cast<size_t>(n));
  launch(Device::cpu(), n, kernels::Im2col{want.data(), x.data(), g, s.batch});
  cpu::im2col(x.data(), g, s.batch, col.data());
  const int64_t wrong = static_cast<int64_t>(std::memcmp(col.data(), want.data(), col.size() * 4) != 0);
  const LoopClock clock;
  for (auto _ : state) {
    if (reference)
      launch(Device::cpu(), n, kernels::Im2col{col.data(), x.data(), g, s.batch});
    else
      cpu::im2col(x.data(), g, s.batch, col.data());
    benchmark::DoNotOptimize(col.data());
  }
  report(state, clock, 0, 4.0 * static_cast<double>(n + x.size()), wrong);
}
BENCHMARK_CAPTURE(BM_Im2col, conv1, kConv1, false);
BENCHMARK_CAPTURE(BM_Im2col, conv1_functor, kConv1, true);
BENCHMARK_CAPTURE(BM_Im2col, conv2, kConv2, false);
BENCHMARK_CAPTURE(BM_Im2col, conv2_functor, kConv2, true);

void BM_Col2im(benchmark::State& state, ConvShape s, bool reference) {
  const kernels::ConvGeometry g = s.geometry();
  const int64_t n_col = s.c * s.k * s.k * s.batch * g.oh * g.ow, n = s.batch * s.c * s.hw * s.hw;
  std::vector<float> col = random_floats(static_cast<size_t>(n_col), 4);  // scratch for cpu::col2im
  std::vector<float> dx(static_cast<size_t>(n)), want(static_cast<size_t>(n));
  launch(Device::cpu(), n, kernels::Col2im{want.data(), col.data(), g, s.batch});
  cpu::col2im(col.data(), g, s.batch, dx.data());
  const int64_t wrong = static_cast<int64_t>(std::memcmp(dx.data(), want.data(), dx.size() * 4) != 0);
  const LoopClock clock;
  for (auto _ : state) {
    if (reference)
      launch(Device::cpu(), n, kernels::Col2im{dx.data(), col.data(), g, s.batch});
    else
      cpu::col2im(col.data(), g, s.batch, dx.data());
    benchmark::DoNotOptimize(dx.data());
  }
  report(state, clock, 0, 4.0 * static_cast<double>(n_col + n), wrong);
}
BENCHMARK_CAPTURE(BM_Col2im, conv2, kConv2, false);
BENCHMARK_CAPTURE(BM_Col2im, conv2_functor, kConv2, true);

void BM_MaxPool(benchmark::State& state, int64_t channels, int64_t hw, bool backward) {
  const int64_t batch = 64, planes = batch * channels, o = hw / 2;
  const kernels::ConvGeometry g{channels, hw, hw, 2, 2, 2, 0, o, o};
  const std::vector<float> x = random_floats(static_cast<size_t>(planes * hw * hw), 5);
  const std::vector<float> dy = random_floats(static_cast<size_t>(planes * o * o), 6);
  std::vector<float> y(dy.size()), want_y(dy.size()), dx(x.size()), want_dx(x.size());
  std::vector<int32_t> at(dy.size()), want_at(dy.size());
  launch(Device::cpu(), planes * o * o, kernels::MaxPoolForward{want_y.data(), want_at.data(), x.data(), g});
  launch(Device::cpu(), planes * hw * hw, kernels::MaxPoolBackward{want_dx.data(), dy.data(), want_at.data(), g});
  cpu::maxpool_forward(x.data(), g, planes, y.data(), at.data());
  cpu::maxpool_backward(dy.data(), at.data(), g, planes, dx.data());
  const int64_t wrong = (y != want_y) + (at != want_at) + (dx != want_dx);
  const LoopClock clock;
  for (auto _ : state) {
    if (backward)
      cpu::maxpool_backward(dy.data(), at.data(), g, planes, dx.data());
    else
      cpu::maxpool_forward(x.data(), g, planes, y.data(), at.data());
    benchmark::ClobberMemory();
  }
  const double bytes = backward ? 4.0 * static_cast<double>(2 * dy.size() + dx.size())
                                : 4.0 * static_cast<double>(x.size() + 2 * y.size());
  report(state, clock, 0, bytes, wrong);
}
BENCHMARK_CAPTURE(BM_MaxPool, fwd_6x28x28, 6, 28, false);
BENCHMARK_CAPTURE(BM_MaxPool, bwd_6x28x28, 6, 28, true);
BENCHMARK_CAPTURE(BM_MaxPool, fwd_16x10x10, 16, 10, false);
BENCHMARK_CAPTURE(BM_MaxPool, bwd_16x10x10, 16, 10, true);

// ---- Convolution layers (with the ReLU that follows them in the CNN, fused) ----

// Forward output of a few samples against a direct convolution in double precision.
int64_t conv_forward_wrong(Conv2d& conv, const Tensor& x, const Tensor& y, ConvShape s, int64_t out_c) {
  const std::vector<float> xv = x.to_vector(), yv = y.to_vector();
  const std::vector<float> w = conv.parameters()[0]->value.to_vector(), b = conv.parameters()[1]->value.to_vector();
  const kernels::ConvGeometry g = s.geometry();
  int64_t wrong = 0;
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t oc = 0; oc < out_c; ++oc)
      for (int64_t oy = 0; oy < g.oh; ++oy)
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          double acc = b[oc];
          for (int64_t ci = 0; ci < s.c; ++ci)
            for (int64_t ky = 0; ky < s.k; ++ky)
              for (int64_t kx = 0; kx < s.k; ++kx) {
                const int64_t iy = oy - s.pad + ky, ix = ox - s.pad + kx;
                if (iy >= 0 && iy < s.hw && ix >= 0 && ix < s.hw)
                  acc += double(w[((oc * s.c + ci) * s.k + ky) * s.k + kx]) * xv[((n * s.c + ci) * s.hw + iy) * s.hw + ix];
              }
          const double want = std::max(acc, 0.0);
          wrong += !(std::abs(yv[((n * out_c + oc) * g.oh + oy) * g.ow + ox] - want) <= 1e-4 * (1 + std::abs(want)));
        }
  return wrong;
}

void BM_Conv(benchmark::State& state, ConvShape s, int64_t out_c, bool backward, bool input_grad) {
  InitRng rng(7);
  Sequential net;  // Conv2d + ReLU, as in the CNN (the ReLU fuses)
  net.emplace<Conv2d>(s.c, out_c, s.k, 1, s.pad, Device::cpu(), rng).emplace<ReLU>();
  const Tensor x = Tensor::from_vector(random_floats(static_cast<size_t>(s.batch * s.c * s.hw * s.hw), 8),
                                       {s.batch, s.c, s.hw, s.hw});
  Tensor y = net.forward(x);
  const Tensor dy = Tensor::from_vector(random_floats(static_cast<size_t>(y.numel()), 9), y.shape());
  InitRng check_rng(7);
  Conv2d check(s.c, out_c, s.k, 1, s.pad, Device::cpu(), check_rng);  // same initial weights
  const int64_t wrong = conv_forward_wrong(check, x, y, s, out_c);
  const kernels::ConvGeometry g = s.geometry();
  const double gemm_flops = 2.0 * out_c * s.c * s.k * s.k * s.batch * g.oh * g.ow;
  const LoopClock clock;
  for (auto _ : state) {
    if (backward) {
      net.backward(dy, input_grad);
    } else {
      y = net.forward(x);
    }
    benchmark::ClobberMemory();
  }
  report(state, clock, gemm_flops * (backward ? (input_grad ? 2 : 1) : 1), 0, wrong);
}
BENCHMARK_CAPTURE(BM_Conv, conv1_fwd, kConv1, 6, false, false);
BENCHMARK_CAPTURE(BM_Conv, conv1_bwd_no_dx, kConv1, 6, true, false);
BENCHMARK_CAPTURE(BM_Conv, conv2_fwd, kConv2, 16, false, false);
BENCHMARK_CAPTURE(BM_Conv, conv2_bwd, kConv2, 16, true, true);

// ---- Whole training steps: forward, loss, backward, SGD with momentum (no data loading) ----

void BM_TrainStep(benchmark::State& state, ModelKind model, int64_t hidden) {
  const int64_t batch = 64;
  auto net = build_model(ModelSpec{model, {hidden}, 0.f}, {1, 28, 28}, 10, Device::cpu(), 1);
  Sgd sgd(net->parameters(), SgdOptions{0.01f, 0.9f, 0.f, 0.f, false});
  CrossEntropyLoss loss;
  const Tensor x = Tensor::from_vector(random_floats(static_cast<size_t>(batch * 784), 10), {batch, 1, 28, 28});
  Tensor labels = Tensor::empty({batch}, Device::cpu(), DType::kI32);
  for (int64_t i = 0; i < batch; ++i) labels.data_as<int32_t>()[i] = static_cast<int32_t>(i % 10);
  auto step = [&] {
    sgd.zero_grad();
    loss.forward(net->forward(x), labels);
    net->backward(loss.backward(), false);
    sgd.step();
  };
  for (int i = 0; i < 3; ++i) step();
  const float l = loss_value(loss.forward(net->forward(x), labels));
  for (auto _ : state) step();
  state.SetItemsProcessed(state.iterations() * batch);  // samples/s
  state.counters["loss_finite"] = std::isfinite(l) ? 1 : 0;
  if (!std::isfinite(l)) state.SkipWithError("the loss is not finite");
}
BENCHMARK_CAPTURE(BM_TrainStep, mlp_784_256_10, ModelKind::kMlp, 256);
BENCHMARK_CAPTURE(BM_TrainStep, mlp_784_2048_10, ModelKind::kMlp, 2048);
BENCHMARK_CAPTURE(BM_TrainStep, cnn, ModelKind::kCnn, 0);

}  // namespace
}  // namespace dtrain

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  dtrain::g_ceiling = dtrain::measure_ceiling();
  benchmark::AddCustomContext("sgemm_peak_GFLOP/s", fmt::format("{:.1f}", dtrain::g_ceiling.flops / 1e9));
  benchmark::AddCustomContext("memcpy_GB/s", fmt::format("{:.1f}", dtrain::g_ceiling.bytes / 1e9));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
