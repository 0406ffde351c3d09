// launch(device, n, f): runs f(i) for i in [0, n) on the device. Kernels are written once as
// functors with DTRAIN_HD bodies (see core/kernels.h, model/kernels.h); on CPU they run in a
// plain loop, on CUDA in a grid-stride kernel on the compute stream, which the GPU backend
// library instantiated for the functor's type (core/gpu_backend.h). Only this dispatch differs
// between the paths, so the CPU tests exercise the GPU's arithmetic.
#pragma once

#include <cstdint>
#include <type_traits>
#include <typeinfo>

#include "core/device.h"
#include "core/error.h"

#if defined(__CUDACC__)
#define DTRAIN_HD __host__ __device__
#else
#define DTRAIN_HD
#endif

namespace dtrain {

// The CUDA side (core/gpu_backend.cpp): the backend runs the kernel registered for `kernel`.
void launch_on_gpu(const std::type_info& kernel, int64_t n, const void* functor);

// DTRAIN_CPU_CLONES: a CPU loop built for AVX2 and for plain x86-64 (the baseline build targets
// SSE2 only), the better picked when the program loads; used by cpu_loop below and by the
// CPU-shaped loops in model/cpu_*.cpp. AVX2 brings no FMA and no sum is reordered (no
// fast-math), so both clones compute the same floats; an AVX-512 clone would contract a*b+c
// into FMAs and change them.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define DTRAIN_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DTRAIN_CPU_CLONES
#endif

// Iterations are independent by contract (the GPU runs them all at once), which the compiler
// cannot prove through the functor's pointers: ivdep lets it vectorise. The local copy keeps
// the functor's fields out of reach of those pointers' stores.
template <class F>
DTRAIN_CPU_CLONES void cpu_loop(int64_t n, const F& f) {
  const F local = f;
#pragma GCC ivdep
  for (int64_t i = 0; i < n; ++i) local(i);
}

template <class F>
DTRAIN_CPU_CLONES void cpu_loop_range(int64_t begin, int64_t end, const F& f) {
  const F local = f;
#pragma GCC ivdep
  for (int64_t i = begin; i < end; ++i) local(i);
}

// A CPU launch this long is cut into contiguous ranges run on the rank's CPU threads (core/ops.cpp,
// Note [One pool, sleeping waits]): the optimizer's and the gradients' passes over a large weight
// are memory-bound, and one core does not saturate the memory. Shorter ones stay on the caller,
// where a wake-up would cost more than it saves. Iterations are independent (the contract above),
// so the split changes no value.
inline constexpr int64_t kCpuLaunchSplitMin = int64_t{1} << 18;
// Runs body(ctx, begin, end) over parts of [0, n) on the CPU threads; returns when all are done.
void cpu_parallel_ranges(int64_t n, void (*body)(const void* ctx, int64_t begin, int64_t end), const void* ctx);

template <class F>
void launch(Device device, int64_t n, const F& f) {
  if (n <= 0) return;
  if (device.is_cpu()) {
    if (n < kCpuLaunchSplitMin) {
      cpu_loop(n, f);
      return;
    }
    cpu_parallel_ranges(
        n, [](const void* ctx, int64_t begin, int64_t end) { cpu_loop_range(begin, end, *static_cast<const F*>(ctx)); },
        &f);
    return;
  }
  static_assert(std::is_trivially_copyable_v<F>, "kernel functors are passed by value to the GPU");
  launch_on_gpu(typeid(F), n, &f);
}

// Note [Row launches]: launch_rows(device, rows, f) runs f(lanes, r) for every row r < rows, for
// kernels that reduce along a row (softmax, LayerNorm, cross-entropy). A row's loops stride by
// the lanes, `for (c = lanes.lane(); c < n; c += lanes.count())`, and lanes.sum(v) / lanes.max(v)
// combine one value per lane into the row's, which every lane gets. On the CPU a row is one lane
// (OneLane: lane 0 of 1, sum and max return v), so the loops are the plain sequential ones and
// give the bits they always gave; on CUDA a warp of 32 lanes runs a row (core/cuda/launch.cuh:
// coalesced reads, and 32x the threads of one thread per row) and combines by a butterfly of
// shuffles in a fixed order: the same bits on every run, though not the CPU's bits (the sum is
// grouped differently). Only lane 0 writes a row's scalars.
struct OneLane {
  DTRAIN_HD static constexpr int lane() { return 0; }
  DTRAIN_HD static constexpr int count() { return 1; }
  DTRAIN_HD static constexpr float sum(float v) { return v; }
  DTRAIN_HD static constexpr float max(float v) { return v; }
};

// The CPU form of a row kernel, and the key its CUDA launch is registered under.
template <class F>
struct RowsOf {
  F f;
  DTRAIN_HD void operator()(int64_t r) const { f(OneLane{}, r); }
};

template <class F>
void launch_rows(Device device, int64_t rows, const F& f) {
  if (rows <= 0) return;
  if (device.is_cpu()) {
    launch(device, rows, RowsOf<F>{f});
    return;
  }
  static_assert(std::is_trivially_copyable_v<F>, "kernel functors are passed by value to the GPU");
  launch_on_gpu(typeid(RowsOf<F>), rows, &f);
}

}  // namespace dtrain
