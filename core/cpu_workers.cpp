// CpuWorkers (see cpu_workers.h): one job at a time, handed to sleeping workers.
#include "core/cpu_workers.h"

#include <pthread.h>

#include <algorithm>
#include <string>
#include <system_error>

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain {

CpuWorkers::CpuWorkers(int threads) {
  try {
    for (int i = 1; i < std::max(1, threads); ++i) {
      workers_.emplace_back([this, i] { work(i); });
      pthread_setname_np(workers_.back().native_handle(), ("dtrain-cpu-" + std::to_string(i)).substr(0, 15).c_str());
    }
  } catch (const std::system_error& e) {
    // A thread limit (ulimit -u, a container's pids limit): stop the ones started, then one line.
    const size_t started = workers_.size();
    stop();
    throw Error(fmt::format("cannot start {} CPU threads (started {}): {}", threads, started + 1, e.what()),
                ErrorKind::kResources);
  }
}

CpuWorkers::~CpuWorkers() { stop(); }

void CpuWorkers::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
}

void CpuWorkers::run(int parts, const std::function<void(int)>& part) {
  parts = std::clamp(parts, 1, threads());
  std::unique_lock busy(busy_, std::try_to_lock);
  if (parts == 1 || !busy.owns_lock()) {
    for (int i = 0; i < parts; ++i) part(i);
    return;
  }
  {
    std::lock_guard lock(mu_);
    job_ = &part;
    parts_ = parts;
    pending_ = parts - 1;
    error_ = nullptr;
    ++generation_;
  }
  start_cv_.notify_all();
  std::exception_ptr mine;
  try {
    part(0);
  } catch (...) {
    mine = std::current_exception();
  }
  std::unique_lock lock(mu_);
  done_cv_.wait(lock, [this] { return pending_ == 0; });
  job_ = nullptr;
  if (mine) std::rethrow_exception(mine);
  if (error_) std::rethrow_exception(error_);
}

void CpuWorkers::work(int index) {
  uint64_t seen = 0;
  std::unique_lock lock(mu_);
  for (;;) {
    start_cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
    if (stopping_) return;
    seen = generation_;
    if (index >= parts_) continue;  // a job split into fewer parts than there are threads
    const std::function<void(int)>* job = job_;
    lock.unlock();
    std::exception_ptr error;
    try {
      (*job)(index);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error && !error_) error_ = error;
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

}  // namespace dtrain
