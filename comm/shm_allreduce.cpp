// ShmAllreduce: each rank reduces one segment of every block and writes it into every block;
// buffers outside the shared regions go through the window's slots, one block at a time.
#include "comm/shm_allreduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <cerrno>
#include <climits>
#include <ctime>

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "comm/mpi_check.h"

namespace dtrain {

namespace {

// Segments start on 64-byte boundaries so no two owners write into one cache line.
constexpr int64_t kAlignFloats = 16;

int64_t segment_floats(int64_t n, int size) {
  const int64_t per_rank = (n + size - 1) / size;
  return (per_rank + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
}

// Elements reduced at a time (a stack buffer that stays in L1).
constexpr int64_t kChunk = 512;

// Note [Ranks meet on flags]: a rank's flag line (its meeting number and its sleepers' count,
// on a cache line of its own, first in its part of the small window) and how long a wait spins
// before it sleeps.
constexpr int64_t kFlagFloats = 16;
constexpr int64_t kSpinNs = 100'000;

uint32_t* meeting_of(float* base) { return reinterpret_cast<uint32_t*>(base); }
uint32_t* sleepers_of(uint32_t* meeting) { return meeting + 1; }

// A spinning core's hint that it waits.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// A shared (not process-private) futex: the word lies in a node-shared window. FUTEX_WAIT
// sleeps while *word == value, at most 10 ms (then the caller looks again); true when it slept
// that long (ETIMEDOUT), which a lost wake-up turns every late arrival into (futex_timeouts()).
// A futex that fails for any other reason (a seccomp filter, a bad address) would turn every wait
// into a silent busy loop: that is an error, said once.
bool futex(uint32_t* word, int op, uint32_t value) {
  const timespec timeout{0, 10'000'000};
  if (syscall(SYS_futex, word, op, value, op == FUTEX_WAIT ? &timeout : nullptr, nullptr, 0) == -1) {
    const int err = errno;
    DTRAIN_CHECK(err == EAGAIN || err == EINTR || err == ETIMEDOUT, "shared-memory collectives: futex failed: {}",
                 std::strerror(err));
    return err == ETIMEDOUT;
  }
  return false;
}

// acc[i] = the sum over ranks, in rank order, of blocks[r][at + i] (divided by the rank count
// for an average, as divide_in_place does), i < m <= kChunk. The one place either collective
// sums: Note [Reduce-scatter in all-reduce order].
void sum_in_rank_order(const std::vector<float*>& blocks, int64_t at, int64_t m, bool average, float* acc) {
  const float* s0 = blocks[0] + at;
  const float* s1 = blocks[1] + at;
  for (int64_t i = 0; i < m; ++i) acc[i] = s0[i] + s1[i];
  for (size_t r = 2; r < blocks.size(); ++r) {
    const float* sr = blocks[r] + at;
    for (int64_t i = 0; i < m; ++i) acc[i] += sr[i];
  }
  if (average) {
    const float divisor = static_cast<float>(blocks.size());
    for (int64_t i = 0; i < m; ++i) acc[i] /= divisor;
  }
}

}  // namespace

std::unique_ptr<ShmAllreduce> ShmAllreduce::create(MPI_Comm parent, size_t slot_bytes, int64_t small_floats) {
  DTRAIN_CHECK(small_floats >= 0 && small_floats <= kSmallFloats, "ShmAllreduce: small_floats {} not in [0, {}]",
               small_floats, kSmallFloats);
  int parent_size = 0;
  MPI_CHECK(MPI_Comm_size(parent, &parent_size));
  DTRAIN_CHECK(parent_size >= 2, "ShmAllreduce needs at least 2 ranks, got {}", parent_size);
  std::unique_ptr<ShmAllreduce> s(new ShmAllreduce);
  MPI_CHECK(MPI_Comm_dup(parent, &s->comm_));
  MPI_CHECK(MPI_Comm_set_errhandler(s->comm_, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(s->comm_, &s->rank_));
  MPI_CHECK(MPI_Comm_size(s->comm_, &s->size_));
  const int64_t slot_floats = std::max<int64_t>(
      kAlignFloats * s->size_, static_cast<int64_t>(slot_bytes / sizeof(float)) / kAlignFloats * kAlignFloats);
  if (!s->allocate_window(slot_floats, s->slots_)) {
    MPI_Comm_free(&s->comm_);
    return nullptr;
  }
  s->small_floats_ = small_floats;
  const int64_t small_window = kFlagFloats + 2 * small_floats;
  if (!s->allocate_window(small_window, s->small_)) {
    s->free_window(s->slots_);
    MPI_Comm_free(&s->comm_);
    return nullptr;
  }
  std::memset(s->small_.bases[static_cast<size_t>(s->rank_)], 0, sizeof(float) * static_cast<size_t>(small_window));
  MPI_CHECK(MPI_Win_sync(s->small_.win));
  MPI_CHECK(MPI_Barrier(s->comm_));  // every flag is 0 before any rank raises its own
  MPI_CHECK(MPI_Win_sync(s->small_.win));
  s->halves_.resize(static_cast<size_t>(s->size_));
  s->scratch_.resize(static_cast<size_t>(s->size_));
  return s;
}

ShmAllreduce::~ShmAllreduce() = default;

bool ShmAllreduce::allocate_window(int64_t floats, Region& region) {
  // Non-contiguous: each rank's part starts on its own pages, first touched by its owner.
  MPI_Info info = MPI_INFO_NULL;
  MPI_CHECK(MPI_Info_create(&info));
  MPI_CHECK(MPI_Info_set(info, "alloc_shared_noncontig", "true"));
  float* mine = nullptr;
  MPI_Win win = MPI_WIN_NULL;
  const int rc = MPI_Win_allocate_shared(static_cast<MPI_Aint>(floats * static_cast<int64_t>(sizeof(float))),
                                         sizeof(float), info, comm_, &mine, &win);
  MPI_CHECK(MPI_Info_free(&info));
  // A rank without shared memory (a full /dev/shm, say) must not leave its peers in a window
  // collective it will never join: all agree, and all fall back together.
  int ok = rc == MPI_SUCCESS ? 1 : 0;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm_));
  if (!ok) {
    if (win != MPI_WIN_NULL) MPI_Win_free(&win);
    return false;
  }
  region.win = win;
  region.floats = floats;
  region.bases.assign(static_cast<size_t>(size_), nullptr);
  for (int r = 0; r < size_; ++r) {
    MPI_Aint bytes = 0;
    int disp_unit = 0;
    MPI_CHECK(MPI_Win_shared_query(win, r, &bytes, &disp_unit, &region.bases[static_cast<size_t>(r)]));
  }
  // One passive epoch for the window's life: loads and stores between MPI_Win_sync calls.
  MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, win));
  return true;
}

float* ShmAllreduce::allocate_region(int64_t floats) {
  DTRAIN_CHECK(floats > 0, "allocate_region: {} floats", floats);
  Region region;
  if (!allocate_window(floats, region)) return nullptr;
  float* mine = region.bases[static_cast<size_t>(rank_)];
  std::memset(mine, 0, static_cast<size_t>(floats) * sizeof(float));
  regions_.push_back(std::move(region));
  return mine;
}

void ShmAllreduce::barrier(MPI_Win win) {
  MPI_CHECK(MPI_Win_sync(win));  // this rank's stores are visible...
  meet(++meetings_);             // (Note [Ranks meet on flags], not MPI_Barrier)
  MPI_CHECK(MPI_Win_sync(win));  // ...and so are everyone else's
}

void ShmAllreduce::arrive(MPI_Win win, const std::function<void()>& arrived) {
  if (!arrived) return;
  try {
    arrived();
  } catch (...) {
    // Every rank reads the same board here (none can leave the collective before all arrived),
    // so all throw alike; they meet once more first, or one would go on to its next collective
    // and rewrite its board entry while another still reads it (its line would then name the
    // next collective instead of this one).
    barrier(win);
    throw;
  }
}

void ShmAllreduce::meet(uint64_t epoch) {
  // A rank's line: its meeting number (32 bits, compared with wrap-around) and how many ranks
  // sleep on it. Both sides are sequentially consistent, so either the waker sees the sleeper
  // or the sleeper sees the new number (and the futex itself rechecks it).
  const auto target = static_cast<uint32_t>(epoch);
  uint32_t* mine = meeting_of(small_.bases[static_cast<size_t>(rank_)]);
  __atomic_store_n(mine, target, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(sleepers_of(mine), __ATOMIC_SEQ_CST) > 0) futex(mine, FUTEX_WAKE, INT_MAX);
  auto reached = [target](uint32_t seen) { return static_cast<int32_t>(seen - target) >= 0; };
  // One spin budget for the whole meeting, not one per peer: with many ranks per core a spinner
  // takes the core its peers need.
  const int64_t spin_until = steady_now_ns() + kSpinNs;
  for (int r = 0; r < size_; ++r) {
    uint32_t* theirs = meeting_of(small_.bases[static_cast<size_t>(r)]);
    if (reached(__atomic_load_n(theirs, __ATOMIC_ACQUIRE))) continue;
    for (int polls = 1; !reached(__atomic_load_n(theirs, __ATOMIC_ACQUIRE)); ++polls) {
      cpu_relax();
      if (polls % 64 == 0 && steady_now_ns() > spin_until) break;
    }
    if (reached(__atomic_load_n(theirs, __ATOMIC_ACQUIRE))) continue;
    __atomic_add_fetch(sleepers_of(theirs), 1, __ATOMIC_SEQ_CST);
    for (uint32_t seen; !reached(seen = __atomic_load_n(theirs, __ATOMIC_SEQ_CST));) {
      futex_sleeps_.fetch_add(1, std::memory_order_relaxed);
      // Returns when woken, at once if it moved, or after a while.
      if (futex(theirs, FUTEX_WAIT, seen)) futex_timeouts_.fetch_add(1, std::memory_order_relaxed);
    }
    __atomic_sub_fetch(sleepers_of(theirs), 1, __ATOMIC_SEQ_CST);
  }
}

void ShmAllreduce::small_exchange(const float* block, int64_t n, const std::function<void()>& arrived,
                                  const std::function<void()>& work) {
  const int64_t half = kFlagFloats + static_cast<int64_t>(small_calls_++ % 2) * small_floats_;
  for (int r = 0; r < size_; ++r) halves_[static_cast<size_t>(r)] = small_.bases[static_cast<size_t>(r)] + half;
  std::memcpy(halves_[static_cast<size_t>(rank_)], block, static_cast<size_t>(n) * sizeof(float));
  barrier(small_.win);  // every rank's block is in its half
  if (arrived) {
    // Every rank reads the board (the check) before any goes on to its next collective, which
    // rewrites its entry.
    arrive(small_.win, arrived);
    barrier(small_.win);
  }
  work();
  reductions_.fetch_add(1, std::memory_order_relaxed);
}

void ShmAllreduce::reduce_block(MPI_Win win, const std::vector<float*>& blocks, float* out, int64_t n, bool average,
                                const std::function<void()>& arrived) {
  barrier(win);  // every rank's block is complete
  arrive(win, arrived);

  // This rank owns [lo, hi) of every block: it alone reads and writes it until the next barrier,
  // so summing in place is race-free. It sums in rank order, so every rank gets its bits, and
  // pushes the sum into every rank's block (Note [Push, not pull]).
  const int64_t seg = segment_floats(n, size_);
  const int64_t lo = std::min(n, rank_ * seg), hi = std::min(n, lo + seg);
  alignas(64) float acc[kChunk];
  for (int64_t b = lo; b < hi; b += kChunk) {
    const int64_t m = std::min(kChunk, hi - b);
    sum_in_rank_order(blocks, b, m, average, acc);
    for (float* dst : blocks) std::memcpy(dst + b, acc, static_cast<size_t>(m) * sizeof(float));
  }
  barrier(win);  // every segment is in every block; nobody touches another rank's block again

  float* mine = blocks[static_cast<size_t>(rank_)];
  if (out != mine) std::memcpy(out, mine, static_cast<size_t>(n) * sizeof(float));
}

const ShmAllreduce::Region* ShmAllreduce::region_of(const float* buf, int64_t count, int64_t& offset) const {
  for (const Region& region : regions_) {
    // Compared as addresses: `buf` usually points into some other allocation.
    const auto mine = reinterpret_cast<uintptr_t>(region.bases[static_cast<size_t>(rank_)]);
    const auto at = reinterpret_cast<uintptr_t>(buf);
    if (at < mine || at + static_cast<uintptr_t>(count) * sizeof(float) > mine + region.floats * sizeof(float)) continue;
    offset = static_cast<int64_t>((at - mine) / sizeof(float));
    return &region;
  }
  return nullptr;
}

void ShmAllreduce::allreduce(float* buf, int64_t count, ReduceOp op, const std::function<void()>& arrived) {
  const bool average = op == ReduceOp::kAvg;
  if (small(count)) {
    // Every rank sums all halves, in rank order: the bits the owner of a segment writes below.
    small_exchange(buf, count, arrived, [&] {
      alignas(64) float acc[kChunk];
      for (int64_t b = 0; b < count; b += kChunk) {
        const int64_t m = std::min(kChunk, count - b);
        sum_in_rank_order(halves_, b, m, average, acc);
        std::memcpy(buf + b, acc, static_cast<size_t>(m) * sizeof(float));
      }
    });
    return;
  }
  int64_t offset = 0;
  if (const Region* region = region_of(buf, count, offset)) {
    for (int r = 0; r < size_; ++r) scratch_[static_cast<size_t>(r)] = region->bases[static_cast<size_t>(r)] + offset;
    reduce_block(region->win, scratch_, buf, count, average, arrived);
    reductions_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const int64_t slot_floats = slots_.floats;
  for (int64_t base = 0; base < count; base += slot_floats) {
    const int64_t n = std::min(slot_floats, count - base);
    std::memcpy(slots_.bases[static_cast<size_t>(rank_)], buf + base, static_cast<size_t>(n) * sizeof(float));
    reduce_block(slots_.win, slots_.bases, buf + base, n, average, base == 0 ? arrived : std::function<void()>());
  }
  reductions_.fetch_add(1, std::memory_order_relaxed);
}

void ShmAllreduce::exchange(MPI_Win win, const std::function<void()>& arrived, const std::function<void()>& work) {
  barrier(win);  // every rank's data is in place
  arrive(win, arrived);
  work();
  barrier(win);  // nobody reads another's copy any more: each may change its own
}

void ShmAllreduce::in_rounds(int64_t count, int64_t part, const std::function<void()>& arrived,
                             const std::function<void(float* slot, int64_t base, int64_t m)>& stage,
                             const std::function<void(int64_t base, int64_t m)>& work) {
  for (int64_t base = 0; base < count; base += part) {
    const int64_t m = std::min(part, count - base);
    stage(slots_.bases[static_cast<size_t>(rank_)], base, m);
    exchange(slots_.win, base == 0 ? arrived : std::function<void()>(), [&] { work(base, m); });
  }
}

void ShmAllreduce::reduce_scatter(const float* send, float* recv, int64_t count_per_rank, ReduceOp op,
                                  const std::function<void()>& arrived) {
  const bool average = op == ReduceOp::kAvg;
  alignas(64) float acc[kChunk];
  // Sums the n floats of this rank's block, which starts at `block` in every copy of `blocks`,
  // into recv + out. Each rank reads only its own block of the others' copies and writes only
  // `recv` (possibly its own block of its own copy), so nothing races.
  auto reduce_mine = [&](const std::vector<float*>& blocks, int64_t block, int64_t n, int64_t out) {
    for (int64_t b = 0; b < n; b += kChunk) {
      const int64_t m = std::min(kChunk, n - b);
      sum_in_rank_order(blocks, block + b, m, average, acc);
      std::memcpy(recv + out + b, acc, static_cast<size_t>(m) * sizeof(float));
    }
  };
  int64_t offset = 0;
  if (const Region* region = region_of(send, count_per_rank * size_, offset)) {
    for (int r = 0; r < size_; ++r) scratch_[static_cast<size_t>(r)] = region->bases[static_cast<size_t>(r)] + offset;
    exchange(region->win, arrived, [&] { reduce_mine(scratch_, rank_ * count_per_rank, count_per_rank, 0); });
  } else {
    // Each round, every rank stages `m` floats of each of its blocks (block b at b * m) and
    // reduces its own block's part from every slot.
    in_rounds(
        count_per_rank, slots_.floats / size_, arrived,
        [&](float* slot, int64_t base, int64_t m) {
          for (int64_t b = 0; b < size_; ++b)
            std::memcpy(slot + b * m, send + b * count_per_rank + base, static_cast<size_t>(m) * sizeof(float));
        },
        [&](int64_t base, int64_t m) { reduce_mine(slots_.bases, rank_ * m, m, base); });
  }
  reductions_.fetch_add(1, std::memory_order_relaxed);
}

void ShmAllreduce::allgather(const float* send, float* recv, int64_t count_per_rank,
                             const std::function<void()>& arrived) {
  if (small(count_per_rank)) {
    small_exchange(send, count_per_rank, arrived, [&] {
      for (int r = 0; r < size_; ++r)
        if (recv + r * count_per_rank != send)  // in place: this rank's block is already there
          std::memcpy(recv + r * count_per_rank, halves_[static_cast<size_t>(r)],
                      static_cast<size_t>(count_per_rank) * sizeof(float));
    });
    return;
  }
  int64_t offset = 0;
  if (const Region* region = region_of(recv, count_per_rank * size_, offset)) {
    // Pushed into every copy once every rank is here (before, one may still read its copy).
    const int64_t at = offset + rank_ * count_per_rank;
    exchange(region->win, arrived, [&] {
      for (float* base : region->bases)
        if (base + at != send) std::memcpy(base + at, send, static_cast<size_t>(count_per_rank) * sizeof(float));
    });
  } else {
    // Each round, every rank stages `m` floats of its block and copies that part of every
    // block out of the slots.
    in_rounds(
        count_per_rank, slots_.floats, arrived,
        [&](float* slot, int64_t base, int64_t m) {
          std::memcpy(slot, send + base, static_cast<size_t>(m) * sizeof(float));
        },
        [&](int64_t base, int64_t m) {
          for (int r = 0; r < size_; ++r)
            if (recv + r * count_per_rank != send)  // in place: this rank's block is already there
              std::memcpy(recv + r * count_per_rank + base, slots_.bases[static_cast<size_t>(r)],
                          static_cast<size_t>(m) * sizeof(float));
        });
  }
  reductions_.fetch_add(1, std::memory_order_relaxed);
}

void ShmAllreduce::free_window(Region& region) {
  if (region.win == MPI_WIN_NULL) return;
  MPI_CHECK(MPI_Win_unlock_all(region.win));
  MPI_CHECK(MPI_Win_free(&region.win));
}

void ShmAllreduce::release() {
  for (Region& r : regions_) free_window(r);
  regions_.clear();
  free_window(slots_);
  free_window(small_);
  if (comm_ != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(&comm_));
}

}  // namespace dtrain
