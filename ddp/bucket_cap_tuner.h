// BucketCapTuner: `--bucket-cap-mb auto`. Note [Bucket cap autotuning]: the best cap depends on
// the model, the network and how much backward there is to hide an all-reduce behind, so the
// tuner measures instead of guessing. Each candidate (first bucket, cap) runs a warm-up step and
// then a few measured steps; a step's cost is its synced backward (backward start to the last
// all-reduce done: what the buckets change; on a GPU the compute stream is synchronised during
// the trials so that the host clock sees it). Every rank reports its median per candidate, a
// candidate costs what its slowest rank measured (the step waits for that rank), and the
// cheapest wins, earlier candidates on ties: every rank computes the same choice from the same
// gathered figures. Candidates that give the same buckets are tried once.
#pragma once

#include <cstddef>
#include <vector>

namespace dtrain {

struct BucketCaps {
  size_t first_bucket_bytes = 0;
  size_t bucket_cap_bytes = 0;
  bool operator==(const BucketCaps&) const = default;
};

// 1 MiB first bucket with caps 1, 4, 16 and 64 MiB (PyTorch's small first bucket), then one
// 64 MiB cap for every bucket (no small first bucket: fewer, larger all-reduces).
std::vector<BucketCaps> default_bucket_cap_candidates();

// Per candidate, the slowest rank's figure: per_rank_ms[r][c] is rank r's median for candidate c.
std::vector<double> slowest_rank_ms(const std::vector<std::vector<double>>& per_rank_ms);

// The candidate whose slowest rank is fastest: per_rank_ms[r][c] is rank r's median for
// candidate c. Ties go to the earlier candidate.
size_t choose_fastest_candidate(const std::vector<std::vector<double>>& per_rank_ms);

class BucketCapTuner {
 public:
  BucketCapTuner(std::vector<BucketCaps> candidates, int warmup_steps = 1, int measured_steps = 8);

  const std::vector<BucketCaps>& candidates() const { return candidates_; }
  size_t current() const { return current_; }
  bool finished() const { return current_ == candidates_.size(); }
  // One synced backward under the current candidate took `ms`; returns true when that
  // candidate is done (then current() has moved to the next, or finished()).
  bool record(double ms);
  // This rank's median per candidate (once finished).
  const std::vector<double>& medians() const { return medians_; }

 private:
  std::vector<BucketCaps> candidates_;
  int warmup_steps_, measured_steps_;
  size_t current_ = 0;
  int seen_ = 0;  // steps of the current candidate
  std::vector<double> samples_;
  std::vector<double> medians_;
};

}  // namespace dtrain
