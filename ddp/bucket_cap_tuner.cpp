#include "ddp/bucket_cap_tuner.h"

#include <algorithm>

#include "core/error.h"

namespace dtrain {

std::vector<BucketCaps> default_bucket_cap_candidates() {
  constexpr size_t MiB = size_t{1} << 20;
  return {{MiB, MiB}, {MiB, 4 * MiB}, {MiB, 16 * MiB}, {MiB, 64 * MiB}, {64 * MiB, 64 * MiB}};
}

std::vector<double> slowest_rank_ms(const std::vector<std::vector<double>>& per_rank_ms) {
  DTRAIN_CHECK(!per_rank_ms.empty() && !per_rank_ms[0].empty(), "no bucket cap measurements");
  std::vector<double> slowest(per_rank_ms[0].size(), 0.0);
  for (const auto& rank : per_rank_ms) {
    DTRAIN_CHECK(rank.size() == slowest.size(), "ranks measured {} and {} bucket cap candidates", rank.size(),
                 slowest.size());
    for (size_t c = 0; c < rank.size(); ++c) slowest[c] = std::max(slowest[c], rank[c]);
  }
  return slowest;
}

size_t choose_fastest_candidate(const std::vector<std::vector<double>>& per_rank_ms) {
  const std::vector<double> slowest = slowest_rank_ms(per_rank_ms);
  return static_cast<size_t>(std::min_element(slowest.begin(), slowest.end()) - slowest.begin());  // first of ties
}

BucketCapTuner::BucketCapTuner(std::vector<BucketCaps> candidates, int warmup_steps, int measured_steps)
    : candidates_(std::move(candidates)), warmup_steps_(warmup_steps), measured_steps_(measured_steps) {
  DTRAIN_CHECK(!candidates_.empty() && warmup_steps_ >= 0 && measured_steps_ >= 1, "bucket cap tuner: {} candidates",
               candidates_.size());
}

bool BucketCapTuner::record(double ms) {
  DTRAIN_CHECK(!finished(), "bucket cap tuner: a step recorded after the choice");
  if (seen_++ >= warmup_steps_) samples_.push_back(ms);
  if (static_cast<int>(samples_.size()) < measured_steps_) return false;
  std::nth_element(samples_.begin(), samples_.begin() + static_cast<std::ptrdiff_t>(samples_.size() / 2), samples_.end());
  medians_.push_back(samples_[samples_.size() / 2]);
  samples_.clear();
  seen_ = 0;
  ++current_;
  return true;
}

}  // namespace dtrain
