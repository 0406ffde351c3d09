// Per-collective consistency: what a collective is (sequence number, kind, element count,
// dtype) and the one line that names how ranks differ when they issued different ones.
//
// Note [Checking every collective]: ranks that issue different collectives (another bucket plan,
// a branch taken on one rank only) hang or, worse, reduce mismatched buffers. Three checks, from
// cheapest to most thorough:
//  - the shared-memory all-reduce compares every rank's progress-board entry once all arrived
//    (always on: loads from one node-shared window);
//  - the watchdog thread, when a collective has run for kMismatchCheckAfterNs, reads the board and
//    ends the job at once if a rank of this node is in the same sequence number with another
//    kind, count or dtype (always on: it costs nothing until a collective is slow);
//  - with `check_every_collective` (dtrain train --debug-collectives), every MPI collective is
//    preceded by a 64-byte MPI_Allreduce of its header (MAX of h and -h: equal on every rank iff
//    max == -min), which also covers ranks on other nodes and mismatches MPI would not notice.
//    It costs one small all-reduce per MPI collective; see README ("When things go wrong") for
//    the measurement that keeps it off by default.
// Every rank sees the same headers, so every rank takes the same decision: all throw, none waits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace dtrain {

struct CollectiveHeader {
  int64_t seq = 0;
  int kind = 0;  // ProgressBoard::kind_code
  int64_t count = 0;
  int dtype = 0;
  bool operator==(const CollectiveHeader&) const = default;
};

// After a collective has run this long, the watchdog looks for ranks in a different one.
constexpr int64_t kMismatchCheckAfterNs = 1'000'000'000;

// The 8 int64s whose element-wise MAX over ranks shows whether all headers agree.
void pack_header_check(const CollectiveHeader& h, int64_t out[8]);
bool header_check_agrees(const int64_t reduced[8]);

// "ranks issued different collectives at #12: rank 0: allreduce of 100 int32; ranks 1,2:
// allreduce of 120 int32"; "" when all headers agree. `all[r]` is rank r's header. Pure.
std::string header_mismatch_text(const std::vector<CollectiveHeader>& all);

}  // namespace dtrain
