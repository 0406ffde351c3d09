// NcclWatchdog: hang safety for NCCL. A thread polls, every few milliseconds, the completion
// events of the collectives in flight and ncclCommGetAsyncError; when one has been in flight
// longer than the timeout, or NCCL reports an error, it prints one line naming rank,
// collective and sequence number and exits the process non-zero. The launcher then takes the
// job down, so no peer waits forever on a rank that is gone. The decision itself is
// comm/watchdog_policy.h.
//
// Before anything else it marks the process poisoned (Note [A poisoned step is never saved] in
// core/poison.h). It does not call ncclCommAbort: that makes the running and queued kernels
// return early with partial sums while the compute stream carries on (results a checkpoint
// could pick up), and NCCL forbids aborting a blocking communicator while another thread (the
// main one, in ncclAllReduce or ncclGroupEnd) is inside a NCCL call. Ending the process ends
// its kernels and proxy threads with it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <nccl.h>

#include "comm/dump_on_request.h"
#include "comm/watchdog_policy.h"
#include "core/stream.h"

namespace dtrain {

class NcclWatchdog {
 public:
  static constexpr int kExitCode = 1;

  // `dump` writes the flight recorder when the watchdog fires (the reason in, where it went
  // out): the line then names the dump, as the MPI watchdog's does. With `dump_requests`
  // (comm's count of dump requests, NcclOptions::dump_requests) it also writes it on SIGUSR1,
  // and the run goes on.
  NcclWatchdog(int rank, int device, std::chrono::milliseconds timeout,
               std::chrono::milliseconds poll_interval = std::chrono::milliseconds(5), DumpOnRequest::Dump dump = {},
               DumpOnRequest::Counter dump_requests = nullptr);
  ~NcclWatchdog();  // stops and joins the thread
  NcclWatchdog(const NcclWatchdog&) = delete;
  NcclWatchdog& operator=(const NcclWatchdog&) = delete;

  // From init's end to destroy's start: async errors of `comm` are polled (it is never aborted: see fire()).
  void attach(ncclComm_t comm);
  void detach();

  // An operation starts: it is pending from now until end(key), or, once set_done() gave it
  // an event, until that event completes (on_complete then runs on the watchdog thread).
  // seq 0 marks set-up and shut-down phases. Returns a key for set_done()/end().
  int64_t begin(int64_t seq, std::string op);
  void set_done(int64_t key, std::shared_ptr<Event> done, std::function<void()> on_complete = {});
  void end(int64_t key);

  // Empty, or what failed (the line the watchdog printed, less its "dtrain: rank N: "; the
  // process is then on its way out).
  std::string failure() const;
  void throw_if_failed() const;

 private:
  struct Entry {
    WatchdogPending pending;
    std::shared_ptr<Event> done;
    std::function<void()> on_complete;
  };

  void run();
  [[noreturn]] void fire(const WatchdogVerdict& verdict);

  const int rank_;
  const int device_;
  const std::chrono::milliseconds timeout_;
  const std::chrono::milliseconds poll_interval_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  ncclComm_t comm_ = nullptr;
  int64_t next_key_ = 0;
  std::map<int64_t, Entry> entries_;
  std::string failure_;
  const DumpOnRequest::Dump dump_;
  DumpOnRequest usr1_;  // the watchdog thread's alone
  std::thread thread_;  // last: starts after every member above exists
};

}  // namespace dtrain
