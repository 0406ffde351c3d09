// DistributedSampler: the seeded permutation, padding/truncation and the strided rank shard.
#include "data/distributed_sampler.h"

#include <numeric>
#include <random>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain {
namespace {

// Uniform in [0, bound) by rejection: std::uniform_int_distribution's algorithm is left to
// each standard library, this one is fixed, so all ranks on all platforms agree.
uint64_t uniform_below(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t threshold = (uint64_t{0} - bound) % bound;  // 2^64 mod bound: the biased low values
  while (true) {
    uint64_t r = rng();
    if (r >= threshold) return r % bound;
  }
}

// Positions p of [from, N) with p = rank (mod R): this rank's share of the rest of an epoch.
int64_t uneven_share(int64_t n, int64_t from, int rank, int replicas) {
  const int64_t first = from + rank;
  return first >= n ? 0 : (n - first + replicas - 1) / replicas;
}

}  // namespace

const char* sampler_tail_name(SamplerTail tail) {
  switch (tail) {
    case SamplerTail::kPad: return "pad";
    case SamplerTail::kDropLast: return "drop-last";
    case SamplerTail::kUneven: return "uneven";
  }
  return "?";
}

std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), int64_t{0});
  std::mt19937_64 rng(seed);
  for (int64_t i = n - 1; i > 0; --i) {
    auto j = static_cast<int64_t>(uniform_below(rng, static_cast<uint64_t>(i) + 1));
    std::swap(p[i], p[j]);
  }
  return p;
}

DistributedSampler::DistributedSampler(int64_t dataset_size, int num_replicas, int rank, bool shuffle, uint64_t seed,
                                       SamplerTail tail)
    : dataset_size_(dataset_size),
      num_replicas_(num_replicas),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      tail_(tail) {
  if (dataset_size < 0) throw Error(fmt::format("DistributedSampler: dataset size {} is negative", dataset_size));
  if (num_replicas < 1)
    throw Error(fmt::format("DistributedSampler: num_replicas must be >= 1, got {}", num_replicas));
  if (rank < 0 || rank >= num_replicas)
    throw Error(fmt::format("DistributedSampler: rank {} is out of range [0, {})", rank, num_replicas));
  switch (tail) {
    case SamplerTail::kPad: num_samples_ = (dataset_size + num_replicas - 1) / num_replicas; break;
    case SamplerTail::kDropLast: num_samples_ = dataset_size / num_replicas; break;
    case SamplerTail::kUneven: num_samples_ = uneven_share(dataset_size, 0, rank, num_replicas); break;
  }
}

std::vector<int64_t> DistributedSampler::indices_from(int64_t position) const {
  if (position < 0 || position > dataset_size_)
    throw Error(fmt::format("DistributedSampler: epoch position {} is outside [0, {}]", position, dataset_size_));
  const int64_t remaining = dataset_size_ - position;
  const int64_t per_rank = tail_ == SamplerTail::kDropLast ? remaining / num_replicas_
                           : tail_ == SamplerTail::kPad   ? (remaining + num_replicas_ - 1) / num_replicas_
                                                          : uneven_share(dataset_size_, position, rank_, num_replicas_);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(per_rank));
  if (per_rank == 0) return out;
  std::vector<int64_t> order;
  if (shuffle_) {
    order = seeded_permutation(dataset_size_, seed_ + static_cast<uint64_t>(epoch_));
  } else {
    order.resize(static_cast<size_t>(dataset_size_));
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  // Position p of the padded list is order[p % N]: padding repeats the list from its start
  // (cycling when N < R, as PyTorch does); with drop_last only the positions up to a multiple of
  // R are used.
  const int64_t end = tail_ == SamplerTail::kUneven ? dataset_size_ : position + per_rank * num_replicas_;
  for (int64_t p = position + rank_; p < end; p += num_replicas_)
    out.push_back(order[static_cast<size_t>(p % dataset_size_)]);
  return out;
}

}  // namespace dtrain
