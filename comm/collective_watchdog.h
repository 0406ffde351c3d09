// Deadlines for the collectives of the MPI communicator, and what a rank says when one passes.
//
// Note [One watchdog for MPI and NCCL]: a blocking MPI call on the communication thread cannot
// be interrupted, and need not be: the job ends anyway. The communication thread marks the
// collective it is running (begin/end); a watchdog thread wakes every 100 ms, asks the same
// decision NCCL's watchdog asks (watchdog_decide in comm/watchdog_policy.h) and, past the
// deadline, writes this rank's flight recorder, prints one line and ends the process (mpirun
// and dtrain-launch then end the job). Marking costs two atomic stores per collective; the
// thread's wake-ups cost microseconds a second. Polling MPI_Test instead would have kept the
// communication thread spinning (or sleeping, adding latency) on a 2-core machine.
//
// Which ranks have not arrived: the ranks of one node share a ProgressBoard, a node-shared
// window where each writes the sequence number, kind and size of the collective it is in. A
// waiting rank reads its neighbours' slots without their help (a stopped process cannot help)
// and names every local rank that is behind or in a different collective. Ranks on other nodes
// are not on the board: their own lines and dumps say where they stood (dtrain flight-report).
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/dump_on_request.h"
#include "comm/flight_recorder.h"
#include "core/tensor.h"

namespace dtrain {

// Where each rank of one node stands, in a node-shared MPI window.
class ProgressBoard {
 public:
  struct Entry {
    int world_rank = 0;
    int64_t started = 0, completed = 0;  // sequence numbers
    int kind = 0;                        // kind_code() of the started collective
    int64_t count = 0;
    int dtype = 0;
    int64_t heartbeat_ns = 0;  // steady clock (CLOCK_MONOTONIC: one clock for the whole node)
  };
  // Collective over `world`: the node's ranks map one window. nullptr (on every rank of the
  // node) when the window cannot be made.
  static std::unique_ptr<ProgressBoard> create(MPI_Comm world);
  ~ProgressBoard();  // no MPI call: release() first (or MPI is gone)

  static int kind_code(const std::string& kind);
  static const char* kind_name(int code);

  void started(int64_t seq, int kind, int64_t count, DType dtype);
  void completed(int64_t seq);
  void heartbeat(int64_t now_ns);
  std::vector<Entry> read() const;  // every rank of this node, by local rank
  int local_rank() const { return local_rank_; }
  void release();

 private:
  struct Slot;
  ProgressBoard() = default;
  MPI_Comm node_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  int local_rank_ = 0;
  std::vector<Slot*> slots_;
  std::vector<int> world_ranks_;
};

// A rank whose watchdog has not beaten for this long is stopped or frozen (it beats every 100 ms).
constexpr int64_t kHeartbeatStaleNs = 2'000'000'000;

// "rank 2 is not responding (no heartbeat for 5.0 s)", "rank 1 has not arrived (last started
// #11, completed #11)"; "" when every rank of the board is in collective `seq` of the same kind
// and size and alive. `now_ns` 0: heartbeats are not judged. Pure; tested without MPI.
std::string not_arrived_text(const std::vector<ProgressBoard::Entry>& board, int my_local_rank, int64_t seq,
                             int kind, int64_t count, int dtype, int64_t now_ns = 0);
// "ranks issued different collectives at #12: rank 0: barrier of 0 uint8; rank 1: broadcast of
// 10 int32" when ranks of the board are in the same sequence number as `my_local_rank` with
// another kind, count or dtype; "" otherwise (ranks behind or ahead are not compared). Pure.
std::string different_collective_text(const std::vector<ProgressBoard::Entry>& board, int my_local_rank);
// "rank 2 is not responding (stopped or frozen: ...)" for each rank of the board whose heartbeat
// is stale at `now_ns`, "; "-joined; "" if none. Point-to-point's timeout line names its stopped
// peer with it (a transfer is not on the board). Pure.
std::string unresponsive_text(const std::vector<ProgressBoard::Entry>& board, int my_local_rank, int64_t now_ns);
// One entry per world rank of `boards` (boards of one node), the one with the newest heartbeat:
// a rank is stopped only if it beats on none of the boards it is on. Pure.
std::vector<ProgressBoard::Entry> freshest_entries(const std::vector<std::vector<ProgressBoard::Entry>>& boards);
// The world ranks on the board whose heartbeat is stale at `now_ns`. Pure.
std::vector<int> unresponsive_ranks(const std::vector<ProgressBoard::Entry>& board, int my_local_rank, int64_t now_ns);

// What a timeout line says about the others: `board` is this communicator's (this rank at
// `my_local_rank`), `node` every rank of the node at its newest heartbeat on any board of the
// process (freshest_entries; Note [Stopped ranks beyond this communicator]). A member is stale
// only if it beats on no board; a stale rank of the node outside this communicator is added
// ("beyond this communicator, rank 3 is not responding ..."). Pure.
struct TimeoutExplanation {
  std::string others;
  std::vector<int> suspects;  // world ranks seen stopped or frozen
};
TimeoutExplanation explain_timeout(std::vector<ProgressBoard::Entry> board, int my_local_rank,
                                   const std::vector<ProgressBoard::Entry>& node, bool p2p, int64_t seq, int kind,
                                   int64_t count, int dtype, int64_t now_ns);

struct WatchdogSettings {
  double timeout_s = 600;  // 0: no deadline
  std::string dump_dir;    // flight-recorder dumps ("" = the current directory)
};

class CollectiveWatchdog {
 public:
  CollectiveWatchdog(WatchdogSettings settings, int rank, int size, FlightRecorder& recorder, ProgressBoard* board);
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // The communication thread runs collective `seq` now / no longer.
  void begin(int64_t seq) {
    running_since_ns_.store(steady_now_ns_relaxed(), std::memory_order_relaxed);
    running_seq_.store(seq, std::memory_order_release);
  }
  void end() { running_seq_.store(0, std::memory_order_release); }

  // Writes the flight recorder now (on an error, SIGUSR1); returns where, or a reason.
  // `unresponsive`: ranks this one saw stopped or frozen (recorded in the dump).
  std::string dump(const std::string& reason, const std::vector<int>& unresponsive = {});

 private:
  static int64_t steady_now_ns_relaxed();
  void run();
  [[noreturn]] void time_out(int64_t seq, double waited_s);
  // Ranks of this node are in collective `seq` with another kind or size: one line, dump, exit.
  [[noreturn]] void fail_now(int64_t seq, const std::string& differs);

  WatchdogSettings settings_;
  int rank_, size_;
  FlightRecorder& recorder_;
  ProgressBoard* board_;
  std::atomic<int64_t> running_seq_{0}, running_since_ns_{0};
  DumpOnRequest usr1_;  // SIGUSR1: write the recorder, the job goes on
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace dtrain
