// ShmAllreduce: copy in, reduce one segment per rank, copy out, one window slot at a time.
#include "comm/shm_allreduce.h"

#include <algorithm>
#include <cstring>

#include "comm/mpi_check.h"

namespace dtrain {

namespace {

// Segments start on 64-byte boundaries so no two owners write into one cache line.
constexpr int64_t kAlignFloats = 16;

int64_t segment_floats(int64_t n, int size) {
  const int64_t per_rank = (n + size - 1) / size;
  return (per_rank + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
}

}  // namespace

std::unique_ptr<ShmAllreduce> ShmAllreduce::create(MPI_Comm parent, size_t slot_bytes) {
  int parent_size = 0;
  MPI_CHECK(MPI_Comm_size(parent, &parent_size));
  DTRAIN_CHECK(parent_size >= 2, "ShmAllreduce needs at least 2 ranks, got {}", parent_size);
  std::unique_ptr<ShmAllreduce> s(new ShmAllreduce);
  MPI_CHECK(MPI_Comm_dup(parent, &s->comm_));
  MPI_CHECK(MPI_Comm_set_errhandler(s->comm_, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(s->comm_, &s->rank_));
  MPI_CHECK(MPI_Comm_size(s->comm_, &s->size_));
  s->slot_floats_ = std::max<int64_t>(kAlignFloats * s->size_,
                                      static_cast<int64_t>(slot_bytes / sizeof(float)) / kAlignFloats * kAlignFloats);
  // Non-contiguous slots: each rank's slot starts on its own pages, first touched by its owner.
  MPI_Info info = MPI_INFO_NULL;
  MPI_CHECK(MPI_Info_create(&info));
  MPI_CHECK(MPI_Info_set(info, "alloc_shared_noncontig", "true"));
  float* mine = nullptr;
  const int rc = MPI_Win_allocate_shared(static_cast<MPI_Aint>(s->slot_floats_ * sizeof(float)), sizeof(float), info,
                                         s->comm_, &mine, &s->win_);
  MPI_CHECK(MPI_Info_free(&info));
  // A rank without shared memory (a full /dev/shm, say) must not leave its peers in a window
  // collective it will never join: all agree, and all fall back together.
  int ok = rc == MPI_SUCCESS ? 1 : 0;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, s->comm_));
  if (!ok) {
    if (s->win_ != MPI_WIN_NULL) MPI_Win_free(&s->win_);
    MPI_Comm_free(&s->comm_);
    return nullptr;
  }
  s->slots_.resize(static_cast<size_t>(s->size_));
  for (int r = 0; r < s->size_; ++r) {
    MPI_Aint bytes = 0;
    int disp_unit = 0;
    MPI_CHECK(MPI_Win_shared_query(s->win_, r, &bytes, &disp_unit, &s->slots_[static_cast<size_t>(r)]));
  }
  // One passive epoch for the window's life: loads and stores between MPI_Win_sync calls.
  MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, s->win_));
  return s;
}

ShmAllreduce::~ShmAllreduce() = default;

void ShmAllreduce::barrier() {
  MPI_CHECK(MPI_Win_sync(win_));  // this rank's stores are visible...
  MPI_CHECK(MPI_Barrier(comm_));
  MPI_CHECK(MPI_Win_sync(win_));  // ...and so are everyone else's
}

void ShmAllreduce::reduce_segment(int64_t lo, int64_t hi, bool average) {
  // Sum in rank order into a stack block, then store: `mine` is one of the slots being read.
  constexpr int64_t kBlock = 512;
  alignas(64) float acc[kBlock];
  float* mine = slots_[static_cast<size_t>(rank_)];
  const float divisor = static_cast<float>(size_);
  for (int64_t b = lo; b < hi; b += kBlock) {
    const int64_t m = std::min(kBlock, hi - b);
    const float* s0 = slots_[0] + b;
    const float* s1 = slots_[1] + b;
    for (int64_t i = 0; i < m; ++i) acc[i] = s0[i] + s1[i];
    for (int r = 2; r < size_; ++r) {
      const float* sr = slots_[static_cast<size_t>(r)] + b;
      for (int64_t i = 0; i < m; ++i) acc[i] += sr[i];
    }
    if (average)
      for (int64_t i = 0; i < m; ++i) acc[i] /= divisor;  // as divide_in_place does
    std::memcpy(mine + b, acc, static_cast<size_t>(m) * sizeof(float));
  }
}

void ShmAllreduce::allreduce(float* buf, int64_t count, ReduceOp op) {
  float* mine = slots_[static_cast<size_t>(rank_)];
  for (int64_t base = 0; base < count; base += slot_floats_) {
    const int64_t n = std::min(slot_floats_, count - base);
    std::memcpy(mine, buf + base, static_cast<size_t>(n) * sizeof(float));
    barrier();  // every slot holds its rank's block

    // This rank owns [lo, hi): it alone sums it, in rank order, so every rank gets its bits.
    const int64_t seg = segment_floats(n, size_);
    const int64_t lo = std::min(n, rank_ * seg), hi = std::min(n, lo + seg);
    reduce_segment(lo, hi, op == ReduceOp::kAvg);
    barrier();  // every segment is reduced

    for (int r = 0; r < size_; ++r) {
      const int64_t rlo = std::min(n, r * seg), rhi = std::min(n, rlo + seg);
      if (rhi > rlo)
        std::memcpy(buf + base + rlo, slots_[static_cast<size_t>(r)] + rlo, static_cast<size_t>(rhi - rlo) * sizeof(float));
    }
    barrier();  // nobody reads the slots any more: the next block may overwrite them
  }
}

void ShmAllreduce::release() {
  if (win_ != MPI_WIN_NULL) {
    MPI_CHECK(MPI_Win_unlock_all(win_));
    MPI_CHECK(MPI_Win_free(&win_));
  }
  if (comm_ != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(&comm_));
  slots_.clear();
}

}  // namespace dtrain
