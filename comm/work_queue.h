// WorkQueue: one worker thread that runs submitted jobs in FIFO order and hands back a Work
// handle per job. MpiCommunicator runs every MPI call on this thread, so MPI only needs
// MPI_THREAD_SERIALIZED and callers never block on a collective they have not waited for.
// The thread sleeps on a condition variable when the queue is empty (never spins: ranks
// share cores with the compute threads).
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "comm/communicator.h"

namespace dtrain {

// A job's completion, shared by the queue and the caller's handle. wait() sleeps until the job
// has run and rethrows its exception; test() only looks. started_ns()/finished_ns() are set
// when the worker starts and finishes the job (finished before wait() returns).
class QueuedWork final : public Work {
 public:
  void wait() override;
  bool test() override;
  void mark_started();
  void complete(std::exception_ptr error);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

class WorkQueue {
 public:
  // Starts the worker thread (named `name` for debuggers; at most 15 characters are kept).
  explicit WorkQueue(const std::string& name);
  // Stops without draining: jobs not yet started fail with dtrain::Error, a running job
  // finishes, then the thread is joined.
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues `job` behind every earlier one. Throws dtrain::Error once the queue has stopped.
  WorkHandle submit(std::function<void()> job);
  // Runs every job already queued, then joins the thread; later submits throw. Idempotent.
  void drain_and_stop();
  bool stopped() const;

  // A handle that is already complete (for collectives with nothing to move).
  static WorkHandle completed();

  // The worker thread (e.g. for pthread_getcpuclockid: its own CPU time, apart from the
  // process's BLAS threads). Valid until the queue has stopped.
  std::thread::native_handle_type native_handle() { return thread_.native_handle(); }

 private:
  struct Job {
    std::function<void()> run;
    std::shared_ptr<QueuedWork> work;
  };
  void loop();
  void stop(bool drain);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stopping_ = false;
  bool drain_ = true;
  std::thread thread_;
};

}  // namespace dtrain
