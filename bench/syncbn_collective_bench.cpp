// SyncBatchNorm's collectives alone, as one training step of --model resnet18 --width 16 issues
// them (20 BatchNorms: channels 16 x5, 32 x5, 64 x5, 128 x5): per layer, forward all-gathers
// 5C + 1 floats and backward all-reduces 2C (Note [SyncBatchNorm] in model/batchnorm.h), through
// the runtime's gradient communicator with its deadline and flight recorder, as dtrain train
// does. Both ranks run the same loop, so this is the collectives' own cost with little skew.
// Optionally `--work-us U` busy-waits U microseconds before each collective (the compute
// between two BatchNorms), which lets the communication thread fall asleep as in training.
//   dtrain-launch -n 2 -- build/bench/dtrain_syncbn_collective_bench [--steps S] [--work-us U]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "comm/runtime.h"

namespace {

void busy_us(int us) {
  if (us <= 0) return;
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
  while (std::chrono::steady_clock::now() < until) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 200, work_us = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--work-us") == 0) work_us = std::atoi(argv[i + 1]);
  }
  auto runtime = dtrain::init(&argc, &argv);
  dtrain::Communicator& comm = runtime->gradients();
  const int n = comm.size();
  std::vector<int64_t> channels;
  for (int64_t c : {16, 32, 64, 128})
    for (int k = 0; k < 5; ++k) channels.push_back(c);
  std::vector<std::vector<float>> local, gathered, sums;
  for (int64_t c : channels) {
    local.emplace_back(static_cast<size_t>(5 * c + 1), 1.f + static_cast<float>(comm.rank()));
    gathered.emplace_back(static_cast<size_t>(n * (5 * c + 1)));
    sums.emplace_back(static_cast<size_t>(2 * c), 1.f);
  }
  const size_t layers = channels.size();
  std::vector<double> step_us;
  double gather_us = 0, reduce_us = 0;
  for (int s = 0; s < steps + 10; ++s) {
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    double g = 0, r = 0;
    for (size_t l = 0; l < layers; ++l) {
      busy_us(work_us);
      const auto a = std::chrono::steady_clock::now();
      comm.allgather(local[l].data(), gathered[l].data(), static_cast<int64_t>(local[l].size()), dtrain::DType::kF32);
      g += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count();
    }
    for (size_t l = layers; l-- > 0;) {
      busy_us(work_us);
      const auto a = std::chrono::steady_clock::now();
      comm.allreduce(sums[l].data(), static_cast<int64_t>(sums[l].size()), dtrain::DType::kF32, dtrain::ReduceOp::kSum);
      r += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count();
    }
    const double total = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (s >= 10) {  // warm-up
      step_us.push_back(total - 2.0 * static_cast<double>(layers) * work_us);
      gather_us += g;
      reduce_us += r;
    }
  }
  std::sort(step_us.begin(), step_us.end());
  if (comm.rank() == 0)
    std::printf("syncbn collectives (%s, %d ranks, %zu layers, work %d us between): per step median %.0f us "
                "(p10 %.0f, p90 %.0f); mean per all-gather %.1f us, per all-reduce %.1f us\n",
                comm.describe().c_str(), n, layers, work_us, step_us[step_us.size() / 2], step_us[step_us.size() / 10],
                step_us[step_us.size() * 9 / 10], gather_us / steps / static_cast<double>(layers),
                reduce_us / steps / static_cast<double>(layers));
  return 0;
}
