// ShmAllreduce: float32 all-reduce (and reduce-scatter and all-gather, below) through
// node-shared MPI windows, for jobs whose ranks all share one node. MPI's own all-reduce over shared memory (vader) moves each message through
// fragments and a rendezvous. Here rank r owns segment r of the buffer: it sums segment r of
// every rank's copy, in rank order, and writes the sum into every rank's copy. Buffers
// allocated with allocate_region() (the reducer's gradient buckets) are reduced where they lie;
// others are first copied into this rank's slot of a staging window (see Note [Why shm]).
//
// Note [Why shm]: a traced 2-rank step of the seed MLP spent 0.13-0.17 ms of 0.93 ms waiting
// for its 795 KB gradient all-reduce, and a bare MPI_Allreduce of 795 KB took 155-184 us (Open
// MPI 4.1, vader with CMA, every algorithm). Through a staging window it took 88-119 us in
// training, and 64-74 us with the buckets in the window. Exactly one rank computes each reduced
// element, so every rank gets the same bits.
//
// Note [Push, not pull]: the first version had each owner write its sum only into its own copy,
// and every rank then copied the other segments out of their owners' copies. Those reads pull
// cache lines that another core has just written, at about 13-16 GB/s here. Writing the sum
// into every copy costs almost nothing more: the owner has just read those lines, so its
// writes only take ownership. Two ranks on this 2-core VM, 814 KB: 57-69 us to all-reduce and
// 18-20 us to read the result afterwards (pull) against 28-29 us and 24-27 us (push), with one
// barrier fewer; the 2-rank seed MLP went from 148k to 156k samples/s (medians of 6 runs).
//
// Note [Reduce-scatter in all-reduce order]: reduce_scatter() gives rank r block r of the
// buffer, each element summed over the ranks' copies in rank order by the same function the
// all-reduce sums with (sum_in_rank_order), so it has exactly the bits the all-reduce of the
// whole buffer gives those elements (ZeRO-2 relies on it to equal plain DDP bitwise on one node;
// tests/mpi/reduce_scatter_test.cpp checks it). Rank r reduces its own block, so the work is
// spread as the all-reduce's segments are; nothing is pushed into the other ranks' copies.
//
// It runs on the communication thread of the MpiCommunicator that owns it, like every other MPI
// call. Ranks synchronise on flags in a node-shared window (Note [Ranks meet on flags]).
//
// Note [Ranks meet on flags]: a barrier here is a meeting: each rank raises its meeting number
// in its flag line of the small window and waits until every rank's has reached it. A wait
// spins for 100 us (a peer usually arrives within that), then sleeps on a futex on the peer's
// number, which the peer's arrival wakes. This replaced MPI_Barrier, which polls, with
// sched_yield on a rank bound to one core (mpi_yield_when_idle: comm/mpi_lifecycle.cpp): a
// polling communication thread stays runnable and shares the core with its rank's compute
// through a whole overlapped wait, and on a machine with other processes a yielding rank hands
// its core away for a whole time slice, so its peer, having arrived, waits milliseconds more. A
// sleeping rank takes no CPU and, woken, is scheduled at once. SyncBatchNorm shows both: 40 sync
// points per ResNet-18 step (bench/syncbn_collective_bench.cpp, bench/syncbn_cost.sh). The
// stores before a meeting are seen after it (sequentially consistent flags, with MPI_Win_sync
// on either side). A rank that never arrives is the watchdog's to report, as for a barrier that
// never returned: it names the ranks behind from the progress board and ends the process at the
// deadline; a dead peer ends the job through the launcher as before. Linux only (futex), as is
// the rest of the shared-memory path.
//
// Note [Small collectives]: a collective of at most kSmallFloats floats per rank (SyncBatchNorm's
// gathers of 5C + 1 floats and all-reduces of 2C) copies its block into one of two halves of its
// part of the small window (alternating), meets, and reads every rank's half (an all-reduce sums
// them in rank order with the function the large path sums with: the same bits on every rank
// and as the large path). One meeting instead of two: a rank writes a half again only two small
// collectives later, after every rank has passed the meeting of the one in between, so after
// reading this one. With the watchdog's check (`arrived`), a second meeting follows the check, so
// that no rank rewrites its board entry for its next collective while another still reads it.
// Ranks that disagree on the size (one small, one not) still meet first and fail the check alike.
#pragma once

#include <cstddef>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <mpi.h>

#include "comm/communicator.h"

namespace dtrain {

class ShmAllreduce {
 public:
  // Collective over `comm`, whose ranks must all share one node. Returns nullptr on every rank
  // if any rank could not allocate the window (then MPI's all-reduce is used instead).
  // Collectives of at most `small_floats` floats per rank take the small path (Note [Small
  // collectives]; at most kSmallFloats, 0: none do).
  static std::unique_ptr<ShmAllreduce> create(MPI_Comm comm, size_t slot_bytes, int64_t small_floats = kSmallFloats);
  ~ShmAllreduce();  // no MPI call: release() must have run (or MPI be gone)
  ShmAllreduce(const ShmAllreduce&) = delete;
  ShmAllreduce& operator=(const ShmAllreduce&) = delete;

  static bool supports(DType dtype) { return dtype == DType::kF32; }
  // Floats per rank up to which a collective takes the small path (Note [Small collectives]).
  static constexpr int64_t kSmallFloats = 1024;
  // Collective: `floats` zeroed floats in a window of their own, which every rank maps. A buffer
  // inside such a region is reduced where it lies (no copy in or out). nullptr on every rank if
  // any rank could not allocate it.
  float* allocate_region(int64_t floats);
  // In place over `count` floats; every rank calls it with the same count, in the same order,
  // and, for a buffer in a region, at the same offset in the same region.
  // `arrived`, when given, runs once every rank has entered this all-reduce and before any rank
  // reads another's data: a check that all of them are in the same one (it may throw; every
  // rank then throws alike, so none waits).
  void allreduce(float* buf, int64_t count, ReduceOp op, const std::function<void()>& arrived = {});
  // `send` holds size() blocks of count_per_rank floats; `recv` (count_per_rank floats, which
  // may be this rank's block of `send`) receives this rank's block reduced over every rank,
  // summed in the all-reduce's order (Note [Reduce-scatter in all-reduce order]). The rest of
  // `send` is left as it was. `send` in a region is read where it lies; else it is staged
  // through the slots, a part of every block at a time. `arrived` as for allreduce().
  void reduce_scatter(const float* send, float* recv, int64_t count_per_rank, ReduceOp op,
                      const std::function<void()>& arrived = {});
  // `recv` (size() blocks of count_per_rank floats) receives every rank's `send` in rank order;
  // `send` may be this rank's block of `recv`. Copies only, so the bits are the senders'.
  // `recv` in a region: each rank pushes its block into every rank's copy (Note [Push, not
  // pull]); else through the slots, a part of every block at a time. `arrived` as for allreduce().
  void allgather(const float* send, float* recv, int64_t count_per_rank, const std::function<void()>& arrived = {});
  // Collectives this object has completed (calls of allreduce(), reduce_scatter() and
  // allgather()), for tests and logs.
  int64_t reductions() const { return reductions_.load(std::memory_order_relaxed); }
  // Futex sleeps in meetings (Note [Ranks meet on flags]) so far, and how many of them ended by
  // the 10 ms timeout instead of a wake-up: only a peer later than that, or a lost wake-up.
  int64_t futex_sleeps() const { return futex_sleeps_.load(std::memory_order_relaxed); }
  int64_t futex_timeouts() const { return futex_timeouts_.load(std::memory_order_relaxed); }
  // Frees the window and the communicator. Idempotent.
  void release();

 private:
  struct Region {
    MPI_Win win = MPI_WIN_NULL;
    int64_t floats = 0;
    std::vector<float*> bases;  // every rank's copy, mapped into this process
  };
  ShmAllreduce() = default;
  // MPI_Win_allocate_shared on every rank, agreeing on success; fills `region` when all succeed.
  bool allocate_window(int64_t floats, Region& region);
  void free_window(Region& region);
  // A meeting (Note [Ranks meet on flags]) with MPI_Win_sync of `win` (the window the blocks
  // lie in) on either side.
  void barrier(MPI_Win win);
  // `blocks[r]` is rank r's copy of the n floats, in `win`; every block receives the reduced
  // floats, and so does `out` (which may be blocks[rank_]).
  void reduce_block(MPI_Win win, const std::vector<float*>& blocks, float* out, int64_t n, bool average,
                    const std::function<void()>& arrived);
  // Runs `arrived` (if any) once every rank is in the collective; if it throws, every rank
  // does, after one more barrier.
  void arrive(MPI_Win win, const std::function<void()>& arrived);
  // Barrier, `arrived`, `work`, barrier on `win`: `work` may read every rank's data in `win`,
  // and no rank changes its data before all are done.
  void exchange(MPI_Win win, const std::function<void()>& arrived, const std::function<void()>& work);
  // `count` floats per block through the slots, `part` at a time: `stage` fills this rank's
  // slot with part [base, base + m), then `work` runs in an exchange over the slots.
  void in_rounds(int64_t count, int64_t part, const std::function<void()>& arrived,
                 const std::function<void(float* slot, int64_t base, int64_t m)>& stage,
                 const std::function<void(int64_t base, int64_t m)>& work);
  // An all-reduce of `count` floats, or an all-gather of `count` per rank, takes the small path.
  bool small(int64_t count) const { return count <= small_floats_; }
  // Note [Small collectives]: this rank's block (n floats) into its current half, a meeting,
  // `arrived`, then `work` reads every rank's half (halves_[r]).
  void small_exchange(const float* block, int64_t n, const std::function<void()>& arrived,
                      const std::function<void()>& work);
  // Raises this rank's meeting number to `epoch` and waits until every rank's is there.
  void meet(uint64_t epoch);
  // The region holding [buf, buf + count), or null; `offset` is buf's place in this rank's copy.
  const Region* region_of(const float* buf, int64_t count, int64_t& offset) const;

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  Region slots_;                 // the copy-in staging area, one slot per rank
  int64_t small_floats_ = 0;
  Region small_;                 // per rank: its flag line, then two halves of small_floats_
  uint64_t meetings_ = 0;        // meetings so far (the same on every rank)
  uint64_t small_calls_ = 0;     // small collectives so far: which half is current
  std::vector<float*> halves_;   // every rank's current half
  std::vector<Region> regions_;  // from allocate_region
  std::vector<float*> scratch_;  // per-call block pointers
  std::atomic<int64_t> reductions_{0};
  std::atomic<int64_t> futex_sleeps_{0};
  std::atomic<int64_t> futex_timeouts_{0};
};

}  // namespace dtrain
