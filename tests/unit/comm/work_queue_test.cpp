// WorkQueue, the communication thread behind MpiCommunicator: FIFO order, handles that block
// until their job ran and rethrow its error, test() that never blocks, drain on stop, cancel on
// destruction, and an idle thread that sleeps.
#include "comm/work_queue.h"

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <future>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"

namespace dtrain {
namespace {

TEST(WorkQueue, RunsJobsInSubmissionOrderOnOneThread) {
  WorkQueue queue("test-q");
  std::vector<int> order;  // touched only by the worker thread until the waits below
  std::vector<std::thread::id> threads;
  std::vector<WorkHandle> works;
  for (int i = 0; i < 100; ++i) {
    works.push_back(queue.submit([&, i] {
      order.push_back(i);
      threads.push_back(std::this_thread::get_id());
    }));
  }
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
  std::vector<int> expected(100);
  for (int i = 0; i < 100; ++i) expected[i] = i;
  EXPECT_EQ(order, expected);
  for (const auto& id : threads) EXPECT_EQ(id, threads.front());
  EXPECT_NE(threads.front(), std::this_thread::get_id());
}

TEST(WorkQueue, TestDoesNotBlockAndWaitDoes) {
  WorkQueue queue("test-q");
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  WorkHandle blocked = queue.submit([gate] { gate.wait(); });
  WorkHandle behind = queue.submit([] {});
  EXPECT_FALSE(blocked->test());  // returns at once although the job cannot finish yet
  EXPECT_FALSE(behind->test());   // FIFO: cannot overtake
  release.set_value();
  behind->wait();
  EXPECT_TRUE(blocked->test());
  EXPECT_TRUE(behind->test());
}

TEST(WorkQueue, WaitRethrowsTheJobsErrorAndLaterJobsStillRun) {
  WorkQueue queue("test-q");
  WorkHandle failing = queue.submit([] { throw Error("peer went away"); });
  std::atomic<bool> ran{false};
  WorkHandle next = queue.submit([&] { ran = true; });
  try {
    failing->wait();
    ADD_FAILURE() << "wait() did not throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "peer went away");
  }
  EXPECT_TRUE(failing->test());
  EXPECT_THROW(failing->wait(), Error);  // every wait() reports it
  next->wait();
  EXPECT_TRUE(ran);
}

TEST(WorkQueue, CompletedHandleIsDone) {
  WorkHandle done = WorkQueue::completed();
  EXPECT_TRUE(done->test());
  done->wait();
  EXPECT_GT(done->started_ns(), 0);
  EXPECT_LE(done->started_ns(), done->finished_ns());
}

// Traces place each collective by its host start/finish: unknown (0) until it runs, then in
// order, and within the caller's view of submit .. wait.
TEST(WorkQueue, StartAndFinishTimesBracketTheJob) {
  WorkQueue queue("test-q");
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  WorkHandle blocked = queue.submit([gate] { gate.wait(); });
  const int64_t submitted = steady_now_ns();
  WorkHandle behind = queue.submit([] {});
  EXPECT_EQ(behind->started_ns(), 0);
  EXPECT_EQ(behind->finished_ns(), 0);
  release.set_value();
  behind->wait();
  const int64_t waited = steady_now_ns();
  for (const WorkHandle& w : {blocked, behind}) {
    EXPECT_GT(w->started_ns(), 0);
    EXPECT_LE(w->started_ns(), w->finished_ns());
    EXPECT_LE(w->finished_ns(), waited);
  }
  EXPECT_GE(behind->started_ns(), submitted);
  EXPECT_LE(blocked->finished_ns(), behind->started_ns());  // FIFO on one thread
}

TEST(WorkQueue, DrainAndStopRunsEverythingQueuedThenRefusesMore) {
  WorkQueue queue("test-q");
  std::atomic<int> ran{0};
  std::vector<WorkHandle> works;
  for (int i = 0; i < 50; ++i) works.push_back(queue.submit([&] { ++ran; }));
  queue.drain_and_stop();
  EXPECT_EQ(ran, 50);
  for (const WorkHandle& w : works) EXPECT_TRUE(w->test());
  EXPECT_TRUE(queue.stopped());
  EXPECT_THROW(queue.submit([] {}), Error);
  queue.drain_and_stop();  // idempotent
}

TEST(WorkQueue, DestructionCancelsJobsThatHaveNotStarted) {
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::promise<void> started;
  WorkHandle running, queued;
  std::atomic<bool> queued_ran{false};
  std::thread releaser;
  {
    WorkQueue queue("test-q");
    running = queue.submit([&, gate] {
      started.set_value();
      gate.wait();
    });
    queued = queue.submit([&] { queued_ran = true; });
    started.get_future().wait();
    // The destructor waits for the running job; let it finish only once the queue is stopping,
    // so the queued job cannot have started.
    releaser = std::thread([&] {
      while (!queue.stopped()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      release.set_value();
    });
  }
  releaser.join();
  running->wait();  // the running job finished normally
  EXPECT_FALSE(queued_ran);
  EXPECT_THROW(queued->wait(), Error);
}

// The CPU time of the queue's own thread: the process's would count OpenBLAS's spinning
// threads too, which sanitizer builds slow down enough to fail this test.
double thread_cpu_seconds(WorkQueue& queue) {
  clockid_t clock{};
  EXPECT_EQ(pthread_getcpuclockid(queue.native_handle(), &clock), 0);
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// A spinning worker would use a whole core for the sleep; a sleeping one next to nothing.
TEST(WorkQueue, IdleThreadSleeps) {
  WorkQueue queue("test-q");
  queue.submit([] {})->wait();
  const double before = thread_cpu_seconds(queue);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_LT(thread_cpu_seconds(queue) - before, 0.05) << "CPU seconds the queue thread used while idle for 0.3 s";
}

// Other threads of the process spinning (OpenBLAS's, under a sanitizer) are not the queue's.
TEST(WorkQueue, IdleMeasureIgnoresOtherThreadsSpinning) {
  WorkQueue queue("test-q");
  queue.submit([] {})->wait();
  std::atomic<bool> stop{false};
  std::thread spinner([&] {
    while (!stop.load(std::memory_order_relaxed)) {
    }
  });
  const double before = thread_cpu_seconds(queue);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const double used = thread_cpu_seconds(queue) - before;
  stop = true;
  spinner.join();
  EXPECT_LT(used, 0.05) << "CPU seconds charged to the idle queue thread while another thread spun";
}

}  // namespace
}  // namespace dtrain
