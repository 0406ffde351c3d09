// WorkQueue and QueuedWork: the FIFO job thread behind MpiCommunicator.
#include "comm/work_queue.h"

#include <pthread.h>

#include "core/error.h"

namespace dtrain {

void QueuedWork::wait() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [this] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

bool QueuedWork::test() {
  std::lock_guard lock(mu_);
  return done_;
}

void QueuedWork::mark_started() { started_ns_.store(steady_now_ns(), std::memory_order_release); }

void QueuedWork::complete(std::exception_ptr error) {
  // A job cancelled or skipped (nothing to move) never started: it starts and ends now.
  if (started_ns_.load(std::memory_order_acquire) == 0) mark_started();
  finished_ns_.store(steady_now_ns(), std::memory_order_release);
  {
    std::lock_guard lock(mu_);
    error_ = std::move(error);
    done_ = true;
  }
  cv_.notify_all();
}

WorkQueue::WorkQueue(const std::string& name) {
  thread_ = std::thread([this] { loop(); });
  pthread_setname_np(thread_.native_handle(), name.substr(0, 15).c_str());
}

WorkQueue::~WorkQueue() { stop(/*drain=*/false); }

WorkHandle WorkQueue::submit(std::function<void()> job) {
  auto work = std::make_shared<QueuedWork>();
  {
    std::lock_guard lock(mu_);
    if (stopping_) throw Error("collective issued after the communicator was shut down (dtrain::finalize)");
    jobs_.push_back({std::move(job), work});
  }
  cv_.notify_one();
  return work;
}

void WorkQueue::drain_and_stop() { stop(/*drain=*/true); }

bool WorkQueue::stopped() const {
  std::lock_guard lock(mu_);
  return stopping_;
}

WorkHandle WorkQueue::completed() {
  auto work = std::make_shared<QueuedWork>();
  work->complete(nullptr);
  return work;
}

void WorkQueue::stop(bool drain) {
  {
    std::lock_guard lock(mu_);
    if (!stopping_) {
      stopping_ = true;
      drain_ = drain;
    }
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void WorkQueue::loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
      if (stopping_ && !drain_) {
        // Cancel everything that has not started; a peer that already entered the matching
        // collective is torn down by the launcher when this process exits.
        std::deque<Job> cancelled;
        cancelled.swap(jobs_);
        lock.unlock();
        auto error = std::make_exception_ptr(Error("collective cancelled: the communicator was destroyed first"));
        job.work->complete(error);
        for (Job& j : cancelled) j.work->complete(error);
        return;
      }
    }
    std::exception_ptr error;
    job.work->mark_started();
    try {
      job.run();
    } catch (...) {
      error = std::current_exception();
    }
    job.work->complete(error);
  }
}

}  // namespace dtrain
