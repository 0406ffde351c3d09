// Ranks as threads of one test process: a Communicator per thread whose broadcast, all-gather
// and barrier meet at a std::barrier (host memory, blocking), so a unit test can run a collective
// protocol at 2 or 3 ranks without mpirun. It also records the largest broadcast, for the tests
// that bound the memory a transfer needs. All-reduce is not offered (unused here).
#pragma once

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/work_queue.h"
#include "core/error.h"
#include "core/stream.h"

namespace dtrain::testing {

struct ThreadGroup {
  explicit ThreadGroup(int n) : size(n), meet(n), buffers(static_cast<size_t>(n)) {}
  int size;
  std::barrier<> meet;
  std::vector<const void*> buffers;
  std::atomic<int64_t> largest_broadcast{0};
};

class ThreadRank final : public Communicator {
 public:
  ThreadRank(ThreadGroup& group, int rank) : g_(group), rank_(rank), stream_(make_stream(Device::cpu())) {}
  int rank() const override { return rank_; }
  int size() const override { return g_.size; }
  int local_rank() const override { return rank_; }
  int local_size() const override { return g_.size; }
  std::string backend() const override { return "threads"; }
  Stream& stream() override { return *stream_; }

  WorkHandle allreduce_async(void*, int64_t, DType, ReduceOp) override { throw Error("threads: no allreduce"); }
  WorkHandle broadcast_async(void* buf, int64_t count, DType dtype, int root) override {
    const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
    if (rank_ == root) {
      g_.buffers[static_cast<size_t>(root)] = buf;
      int64_t seen = g_.largest_broadcast.load();
      while (static_cast<int64_t>(bytes) > seen && !g_.largest_broadcast.compare_exchange_weak(seen, static_cast<int64_t>(bytes))) {}
    }
    g_.meet.arrive_and_wait();
    if (rank_ != root && bytes) std::memcpy(buf, g_.buffers[static_cast<size_t>(root)], bytes);
    g_.meet.arrive_and_wait();
    return WorkQueue::completed();
  }
  WorkHandle allgather_async(const void* send, void* recv, int64_t count, DType dtype) override {
    const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
    g_.buffers[static_cast<size_t>(rank_)] = send;
    g_.meet.arrive_and_wait();
    for (int r = 0; r < g_.size; ++r)
      if (bytes) std::memcpy(static_cast<std::byte*>(recv) + static_cast<size_t>(r) * bytes, g_.buffers[static_cast<size_t>(r)], bytes);
    g_.meet.arrive_and_wait();
    return WorkQueue::completed();
  }
  WorkHandle barrier_async() override {
    g_.meet.arrive_and_wait();
    return WorkQueue::completed();
  }

 private:
  ThreadGroup& g_;
  int rank_;
  std::unique_ptr<Stream> stream_;
};

// Runs `body(comm)` on `n` ranks (threads); rethrows the first rank's exception.
inline void run_ranks(int n, const std::function<void(Communicator&)>& body, ThreadGroup* group_out = nullptr) {
  ThreadGroup local(n);
  ThreadGroup& group = group_out ? *group_out : local;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      ThreadRank comm(group, r);
      try {
        body(comm);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (std::thread& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace dtrain::testing
