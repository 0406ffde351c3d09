// CollectiveLog: where a communicator records each collective's life (enqueued, started,
// finished), the interface of the flight recorder (comm/flight_recorder.h). Header-only, so the
// NCCL plugin, which does not link comm (Note [GPU plugins without a cycle] in
// core/gpu_backend.h), records through the same calls as the MPI communicator: comm hands it a
// FlightRecorder as a CollectiveLog.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace dtrain {

class CollectiveLog {
 public:
  virtual ~CollectiveLog() = default;
  // A new record, enqueued now (its label is what the calling thread is doing); its sequence number.
  virtual int64_t enqueue(const char* kind, DType dtype, int64_t count) = 0;
  virtual void started(int64_t seq) = 0;
  virtual void finished(int64_t seq, bool ok) = 0;
};

// One collective's record as a backend writes it: enqueued at construction, then started and
// finished when the backend gets there, from whichever thread that is (the MPI communication
// thread; NCCL's watchdog, when the collective's event completes). A null log records nothing.
// Copyable: a completion callback holds its own copy.
class LoggedCollective {
 public:
  LoggedCollective() = default;
  LoggedCollective(CollectiveLog* log, const char* kind, DType dtype, int64_t count)
      : log_(log), seq_(log ? log->enqueue(kind, dtype, count) : 0) {}
  void started() const {
    if (log_) log_->started(seq_);
  }
  void finished(bool ok) const {
    if (log_) log_->finished(seq_, ok);
  }
  int64_t seq() const { return seq_; }  // 0 when nothing is recorded

 private:
  CollectiveLog* log_ = nullptr;
  int64_t seq_ = 0;
};

}  // namespace dtrain
