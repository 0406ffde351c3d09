// NcclWatchdog (see nccl_watchdog.h).
#include "comm/nccl/nccl_watchdog.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#include "comm/nccl/nccl_check.h"
#include "core/error.h"
#include "core/poison.h"

namespace dtrain {

NcclWatchdog::NcclWatchdog(int rank, int device, std::chrono::milliseconds timeout,
                           std::chrono::milliseconds poll_interval, DumpOnRequest::Dump dump,
                           DumpOnRequest::Counter dump_requests)
    : rank_(rank), device_(device), timeout_(timeout), poll_interval_(poll_interval), dump_(std::move(dump)),
      usr1_(rank, "nccl", dump_requests, dump_) {
  DTRAIN_CHECK(timeout.count() > 0, "NCCL timeout must be positive, got {} ms", timeout.count());
  thread_ = std::thread([this] { run(); });
}

NcclWatchdog::~NcclWatchdog() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void NcclWatchdog::attach(ncclComm_t comm) {
  std::lock_guard lock(mutex_);
  comm_ = comm;
}

void NcclWatchdog::detach() {
  std::unique_lock lock(mutex_);
  if (!failure_.empty()) {
    // The watchdog is ending the process: destroying the communicator now would wait on the
    // collective that failed. Wait for the exit.
    lock.unlock();
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  comm_ = nullptr;  // under the lock: the watchdog is not inside ncclCommGetAsyncError(comm)
}

int64_t NcclWatchdog::begin(int64_t seq, std::string op) {
  std::lock_guard lock(mutex_);
  const int64_t key = next_key_++;
  entries_.emplace(key, Entry{WatchdogPending{seq, std::move(op), WatchdogClock::now()}, nullptr, {}});
  return key;
}

void NcclWatchdog::set_done(int64_t key, std::shared_ptr<Event> done, std::function<void()> on_complete) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  it->second.done = std::move(done);
  it->second.on_complete = std::move(on_complete);
}

void NcclWatchdog::end(int64_t key) {
  std::lock_guard lock(mutex_);
  entries_.erase(key);
}

std::string NcclWatchdog::failure() const {
  std::lock_guard lock(mutex_);
  return failure_;
}

void NcclWatchdog::throw_if_failed() const {
  std::string f = failure();
  if (!f.empty()) throw Error(f);
}

void NcclWatchdog::run() {
  // CUDA's current device is per thread and starts at 0: query events on the communicator's
  // device (and never create a context on GPU 0 as a side effect).
  std::string setup_error;
  if (const cudaError_t status = cudaSetDevice(device_); status != cudaSuccess) {
    setup_error = fmt::format("watchdog cudaSetDevice({}): {}", device_, cudaGetErrorString(status));
  }
  std::unique_lock lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, poll_interval_, [this] { return stop_; });
    if (stop_) break;

    std::string error = setup_error;
    std::vector<WatchdogPending> pending;
    std::vector<std::function<void()>> completions;
    for (auto it = entries_.begin(); it != entries_.end();) {
      Entry& entry = it->second;
      bool finished = false;
      if (entry.done) {
        try {
          finished = entry.done->query();
        } catch (const std::exception& e) {  // the device failed under the collective
          if (error.empty()) error = e.what();
        }
      }
      if (finished) {
        if (entry.on_complete) completions.push_back(std::move(entry.on_complete));
        it = entries_.erase(it);
      } else {
        pending.push_back(entry.pending);
        ++it;
      }
    }
    if (comm_ && error.empty()) {
      ncclResult_t async = ncclSuccess;
      const ncclResult_t status = ncclCommGetAsyncError(comm_, &async);
      if (status != ncclSuccess) {
        error = "ncclCommGetAsyncError: " + nccl_error_detail(status, comm_);
      } else if (async != ncclSuccess && async != ncclInProgress) {
        error = nccl_error_detail(async, comm_);
      }
    }
    const WatchdogVerdict verdict = watchdog_decide(pending, WatchdogClock::now(), timeout_, error);
    lock.unlock();
    if (verdict.action != WatchdogAction::kNone) fire(verdict);
    for (auto& complete : completions) complete();
    usr1_.poll();  // without the lock: a dump writes a file
    lock.lock();
  }
}

void NcclWatchdog::fire(const WatchdogVerdict& verdict) {
  // First: from here on no save of this process may become visible (core/poison.h).
  const std::string text = watchdog_failure_text(verdict);
  poison_process(text);
  const std::string line = watchdog_message(rank_, verdict);
  const std::string where = dump_ ? dump_(line) : std::string();
  std::fflush(stdout);
  std::fprintf(stderr, "%s%s\n", line.c_str(), where.empty() ? "" : ("; flight recorder: " + where).c_str());
  std::fflush(stderr);
  {
    // Only now: a main thread that saw it earlier would print a second line and MPI_Abort the
    // process before the dump and the line above were out.
    std::lock_guard lock(mutex_);
    failure_ = text;
  }
  // No ncclCommAbort (nccl_watchdog.h): the exit ends this rank's kernels and proxy threads.
  std::_Exit(kExitCode);  // no destructors: other threads may be blocked inside NCCL or CUDA
}

}  // namespace dtrain
