// CpuWorkers: the threads one rank's CPU GEMMs are split across (Note [One pool, sleeping
// waits] in core/ops.cpp). The caller runs part 0 itself and each other part runs on a worker
// thread that sleeps on a condition variable between jobs, so an idle worker costs no CPU
// (OpenBLAS's and BLIS's own pools busy-wait after every call).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dtrain {

class CpuWorkers {
 public:
  // `threads` counts the caller: threads - 1 worker threads are started (none for 1).
  // Throws Error (kResources) when the threads cannot be started.
  explicit CpuWorkers(int threads);
  ~CpuWorkers();  // joins the workers; no run() may be in progress
  CpuWorkers(const CpuWorkers&) = delete;
  CpuWorkers& operator=(const CpuWorkers&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs part(i) for every i in [0, parts) (clamped to [1, threads()]), part 0 on the calling
  // thread, and returns when all have returned, rethrowing the first exception. A caller that
  // finds another run() in progress (another thread) runs its parts itself, one after another.
  void run(int parts, const std::function<void(int)>& part);

 private:
  void work(int index);
  void stop();  // wakes and joins every worker

  std::mutex busy_;  // held by the thread inside run()
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int)>* job_ = nullptr;
  int parts_ = 0;
  int pending_ = 0;          // worker parts of the current job not yet finished
  uint64_t generation_ = 0;  // bumped per job: a worker runs each job at most once
  bool stopping_ = false;
  std::exception_ptr error_;
  std::vector<std::thread> workers_;  // last: started once everything above is built
};

}  // namespace dtrain
