// DistributedSampler: which sample indices each rank sees in an epoch, as PyTorch's
// torch.utils.data.DistributedSampler does it. The shuffle is a Fisher-Yates over
// std::mt19937_64 with our own unbiased draw, so every platform and standard library gives
// every rank the same permutation.
#pragma once

#include <cstdint>
#include <vector>

namespace dtrain {

// What happens to the last N mod R samples of an epoch. kPad and kDropLast give every rank the
// same count (PyTorch's drop_last=False/True); kUneven gives each rank its positions and no
// more, so counts differ by one sample and ranks may run different numbers of batches (the
// training loop then needs Join: ddp/join.h).
enum class SamplerTail { kPad, kDropLast, kUneven };
const char* sampler_tail_name(SamplerTail tail);  // "pad", "drop-last", "uneven"

class DistributedSampler {
 public:
  // Throws dtrain::Error unless dataset_size >= 0, num_replicas >= 1 and 0 <= rank < num_replicas.
  DistributedSampler(int64_t dataset_size, int num_replicas, int rank, bool shuffle = true, uint64_t seed = 0,
                     SamplerTail tail = SamplerTail::kPad);

  // The permutation of epoch e is seeded by seed + e; call before each epoch.
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

  // This rank's indices for the current epoch: positions rank, rank + R, rank + 2R, ... of the
  // (shuffled) index list, padded from its start (!drop_last) or truncated (drop_last) to
  // total_size(). Always num_samples() long.
  std::vector<int64_t> indices() const { return indices_from(0); }

  // The same for the rest of an epoch of which the positions [0, position) of the (shuffled)
  // index list were used already, possibly at another world size (a resumed run): positions
  // position + rank, position + rank + R, ..., each rank taking ceil((N - position) / R) of them
  // (floor with drop_last), padded from the list's start as above. At the world size that used
  // them, with position a multiple of R, this is the tail of indices(); at another, every
  // remaining position is used once (plus the padding). Throws unless 0 <= position <= N.
  std::vector<int64_t> indices_from(int64_t position) const;

  // Per rank: ceil(N/R) (pad), floor(N/R) (drop-last), or this rank's share (uneven).
  int64_t num_samples() const { return num_samples_; }
  // Samples an epoch uses over all ranks (N with uneven).
  int64_t total_size() const { return tail_ == SamplerTail::kUneven ? dataset_size_ : num_samples_ * num_replicas_; }
  SamplerTail tail() const { return tail_; }
  int64_t dataset_size() const { return dataset_size_; }
  int num_replicas() const { return num_replicas_; }
  int rank() const { return rank_; }

 private:
  int64_t dataset_size_;
  int num_replicas_;
  int rank_;
  bool shuffle_;
  uint64_t seed_;
  SamplerTail tail_;
  int64_t num_samples_ = 0;
  int64_t epoch_ = 0;
};

// The permutation of [0, n) that a seeded shuffle gives (exposed for tests and reuse).
std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed);

}  // namespace dtrain
