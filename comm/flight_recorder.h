// FlightRecorder: the last N collectives of this rank (PyTorch's NCCL flight recorder, for every
// backend): sequence number, kind, dtype, element count, a label saying what the caller was doing,
// and when each was enqueued, started and completed. A hang is then diagnosed from the dumps of
// every rank (`dtrain flight-report DIR`): the first collective some rank never reached, and what
// the others were waiting in. Recording costs one short critical section per state change.
//
// Labels: comm knows nothing of models, so callers say what a collective is for. A process-wide
// context (the training loop sets "epoch 1 step 120") and a per-thread detail (DDP sets "bucket
// 3" while it issues that bucket) are joined into each record's label at enqueue time.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "comm/collective_log.h"
#include "core/tensor.h"

namespace dtrain {

enum class CollectiveState { kEnqueued, kStarted, kCompleted, kFailed };
const char* collective_state_name(CollectiveState state);  // "enqueued", "started", ...

struct CollectiveRecord {
  int64_t seq = 0;          // 1, 2, ... in issue order on this communicator
  std::string kind;         // "allreduce", "broadcast", "allgather", "reduce_scatter", "barrier"
  DType dtype = DType::kF32;
  int64_t count = 0;        // elements (per rank, for allgather and reduce_scatter)
  std::string label;        // "epoch 1 step 120 | bucket 3"
  CollectiveState state = CollectiveState::kEnqueued;
  int64_t enqueued_ns = 0, started_ns = 0, completed_ns = 0;  // steady clock; 0 until then
};

class FlightRecorder final : public CollectiveLog {
 public:
  // `communicator` names whose collectives these are ("mpi", "nccl"): each has its own sequence
  // numbers, dump file and section of the flight report.
  explicit FlightRecorder(size_t capacity = 2000, std::string communicator = "mpi");
  const std::string& communicator() const { return communicator_; }

  // The next record, enqueued now; returns its sequence number.
  int64_t enqueue(const char* kind, DType dtype, int64_t count) override;
  void started(int64_t seq) override;
  void finished(int64_t seq, bool ok) override;

  // The records still in the ring, oldest first.
  std::vector<CollectiveRecord> snapshot() const;
  int64_t last_seq() const;

  // The dump file's JSON text: rank, world size, host, why it was written, the records.
  // `unresponsive`: ranks this one saw stopped or frozen (flight-report names them).
  std::string to_json(int rank, int size, const std::string& reason, const std::vector<int>& unresponsive = {}) const;
  // DIR/flight_recorder_rank<R>.json for "mpi", DIR/flight_recorder_rank<R>_<communicator>.json
  // for the others (DIR "" is the current directory).
  static std::string dump_path(const std::string& dir, int rank, const std::string& communicator = "mpi");
  // Writes to_json() to dump_path() atomically (a temporary file renamed), first removing the
  // temporaries of dead writers (core/temp_files.h); returns the path, or "" with `error` set.
  std::string dump(const std::string& dir, int rank, int size, const std::string& reason,
                   const std::vector<int>& unresponsive, std::string& error) const;

 private:
  CollectiveRecord* find_locked(int64_t seq);

  mutable std::mutex mu_;
  std::vector<CollectiveRecord> ring_;
  size_t capacity_;
  std::string communicator_;
  int64_t next_seq_ = 1;
};

// What the caller is doing, for the labels of the collectives it issues (see the top).
void set_collective_context(std::string context);
class ScopedCollectiveDetail {
 public:
  explicit ScopedCollectiveDetail(std::string detail);
  ~ScopedCollectiveDetail();
  ScopedCollectiveDetail(const ScopedCollectiveDetail&) = delete;
  ScopedCollectiveDetail& operator=(const ScopedCollectiveDetail&) = delete;

 private:
  std::string previous_;
};
std::string collective_label();
std::string collective_detail();  // this thread's detail alone ("" when none)

// SIGUSR1 asks every communicator's watchdog to dump its recorder; async-signal-safe.
void request_flight_recorder_dump();
// How many dumps were requested so far: each watchdog dumps when the count passes what it saw.
uint64_t flight_recorder_dump_requests();

}  // namespace dtrain
