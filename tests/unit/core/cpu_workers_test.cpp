// CpuWorkers: every part runs once, on threads of its own; failures reach the caller; a second
// caller is never blocked.
#include <atomic>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/cpu_workers.h"

namespace dtrain {
namespace {

TEST(CpuWorkers, EachPartRunsOnceOnItsOwnThread) {
  CpuWorkers workers(3);
  EXPECT_EQ(workers.threads(), 3);
  for (int round = 0; round < 200; ++round) {
    const int parts = 1 + round % 3;
    std::vector<std::atomic<int>> runs(3);
    std::mutex mu;
    std::set<std::thread::id> ids;
    workers.run(parts, [&](int i) {
      runs[static_cast<size_t>(i)]++;
      std::lock_guard lock(mu);
      ids.insert(std::this_thread::get_id());
    });
    for (int i = 0; i < 3; ++i) ASSERT_EQ(runs[static_cast<size_t>(i)].load(), i < parts ? 1 : 0) << round;
    ASSERT_EQ(static_cast<int>(ids.size()), parts);
    ASSERT_TRUE(ids.count(std::this_thread::get_id()));  // part 0 ran on the caller
  }
}

TEST(CpuWorkers, PartsClampedToTheThreads) {
  CpuWorkers one(1);
  int runs = 0;
  one.run(4, [&](int i) {
    EXPECT_EQ(i, 0);
    ++runs;
  });
  EXPECT_EQ(runs, 1);
}

TEST(CpuWorkers, AWorkersExceptionReachesTheCaller) {
  CpuWorkers workers(2);
  EXPECT_THROW(workers.run(2,
                           [](int i) {
                             if (i == 1) throw std::runtime_error("part 1 failed");
                           }),
               std::runtime_error);
  int runs = 0;
  workers.run(2, [&](int) { __atomic_add_fetch(&runs, 1, __ATOMIC_RELAXED); });  // still usable
  EXPECT_EQ(runs, 2);
}

TEST(CpuWorkers, TwoCallersAtOnceBothFinish) {
  CpuWorkers workers(2);
  std::atomic<int> total{0};
  auto caller = [&] {
    for (int r = 0; r < 500; ++r) workers.run(2, [&](int) { total++; });
  };
  std::thread other(caller);
  caller();
  other.join();
  EXPECT_EQ(total.load(), 2000);
}

}  // namespace
}  // namespace dtrain
