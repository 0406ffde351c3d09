// FlatStore: every parameter's value and gradient as views into two flat buffers that share one
// index space, and the ranges of it this process's optimizer updates.
//
// Note [Flat store]: parameter i's value is values()[offset(i), offset(i) + numel) and its
// gradient is grads() at the same offset (not under ZeRO-2's ring, where the store keeps only
// the owned gradients: lend_grads); an optimizer keeps its state (momentum, exp_avg, ...)
// in the same index space, so one step over a flat range [a, b) is one kernel launch over
// aligned arrays instead of one per parameter. Elements between parameters (alignment gaps,
// ZeRO's padding) are zero in values and grads and stay zero under every update rule, so a
// launch may span them. (One exception: MPI's in-place reduce-scatter, used across nodes or with
// the shared-memory path off, leaves the blocks a rank does not own as scratch, so under ZeRO-2
// a bucket's padding may then hold partial sums that its owner's update carries along. No
// parameter is a view of it and no exported state piece covers it: nothing reads it.) The layout belongs to whoever moves the gradients: alone, the store lays
// the parameters out in reverse order (the order backward produces them); DistributedDataParallel
// lays them out bucket by bucket in its communicator's buffer (ddp/reducer.h) and, under ZeRO,
// narrows the owned ranges to this rank's shards (Note [ZeRO shards] in ddp/zero_plan.h). A new
// layout keeps every value and gradient, and each listener (the optimizer) moves its state by
// the same permutation. One store per parameter list: DDP and the optimizer built over the same
// parameters find the same store (FlatStore::of). No MPI here: the after-step hook is how DDP
// all-gathers the updated shards.
#pragma once

#include <cstdint>
#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "model/module.h"

namespace dtrain {

// A run of n gradient floats on the store's device.
struct GradSpan {
  float* data;
  int64_t n;
};

struct FlatRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const FlatRange&) const = default;
};

class FlatStore {
 public:
  // The store `params` share (the same list, in the same order), else a new one that moves
  // their values and gradients into flat buffers (a parameter without a gradient gets a zero one)
  // laid out by default_flat_offsets, or, with `lay_out_now` false, at the caller's first
  // lay_out (DDP: one copy of the model fewer at start-up).
  static std::shared_ptr<FlatStore> of(const std::vector<Parameter*>& params, bool lay_out_now = true);

  // What a relayout changed, for listeners: the old offsets and owned ranges (the new ones are
  // the store's).
  struct Relayout {
    std::vector<int64_t> old_offsets;
    std::vector<FlatRange> old_owned;
  };
  using Listener = std::function<void(const Relayout&)>;

  const std::vector<Parameter*>& params() const { return params_; }
  int64_t size() const { return size_; }
  int64_t offset(size_t i) const { return offsets_[i]; }
  const std::vector<int64_t>& offsets() const { return offsets_; }
  Tensor& values() { return values_; }
  Tensor& grads() { return grads_; }
  Device device() const { return device_; }
  // The ranges this process's optimizer updates, ascending and disjoint; [0, size) unless set.
  const std::vector<FlatRange>& owned() const { return owned_; }

  // ZeRO-2's gradient ring (Note [ZeRO-2 gradient ring] in ddp/reducer.h): the store keeps no
  // flat gradient (grads() is undefined and lay_out leaves every p.grad alone: their owner lends
  // them memory during backward); the gradients the optimizer reads are those of the owned
  // ranges, back to back in `owned_grads` (the optimizer state's index space). `lent_bytes`:
  // the memory lent during backward, for the memory report. Call before lay_out.
  void lend_grads(Tensor owned_grads, size_t lent_bytes);
  bool grads_lent() const { return grads_lent_; }
  Tensor& owned_grads() { return owned_grads_; }
  // The gradient of flat element `flat`, which is element `compact` of the owned ranges back to
  // back: where the optimizer reads it.
  float* grad_at(int64_t flat, int64_t compact) {
    return grads_lent_ ? owned_grads_.data() + compact : grads_.data() + flat;
  }
  // ZeRO-2 (ddp/zero_plan.h): only the owned ranges hold reduced gradients (the rest of a flat
  // gradient is this rank's own, or scratch). Set by DDP; lend_grads implies it.
  void set_grads_sharded(bool sharded) { grads_sharded_ = sharded; }
  bool grads_sharded() const { return grads_sharded_ || grads_lent_; }
  // The reduced gradients this rank steps with when sharded: the owned ones.
  std::vector<GradSpan> owned_grad_spans();
  // Gradient bytes this process holds: the flat gradient, or the owned ones and the lent memory.
  size_t grad_bytes() const { return grads_lent_ ? owned_grads_.nbytes() + lent_bytes_ : grads_.nbytes(); }

  // Parameter i moves to offsets[i] of a space of `size` elements (no two overlap); gradients
  // move into `grad_storage` (zeroed here, at least `size` elements; may be the buffer they are
  // in now) or, undefined, a buffer of the store's own. Values and gradients keep their
  // contents; `owned` empty means the whole space. Values move likewise into `value_storage`
  // (ZeRO: the communicator's buffer, so the all-gather of the updated shards writes straight
  // into every rank's copy) or a buffer of the store's own. Then each listener moves its state.
  // The caller has synchronised the compute stream.
  void lay_out(std::vector<int64_t> offsets, int64_t size, Tensor grad_storage = {}, std::vector<FlatRange> owned = {},
               Tensor value_storage = {});

  // Note [Re-cutting sharded state]: under ZeRO a new layout moves owned elements between ranks
  // (bucket rebuild, --bucket-cap-mb auto's trials after optimizer steps), and a listener's
  // compact state for the new owned ranges is partly on other ranks. While lay_out runs, the
  // layout's owner (DDP) may lend a re-cut: from a compact array of the old owned ranges (this
  // rank's part of the old layout) it returns the compact array of the new ones, gathering the
  // other ranks' parts. Collective: every rank's listeners call it for the same arrays in the
  // same order. Unset: a listener moves its state locally.
  using Recut = std::function<Tensor(const Tensor& old_compact)>;
  void set_recut(Recut recut) { recut_ = std::move(recut); }
  bool can_recut() const { return static_cast<bool>(recut_); }
  Tensor recut(const Tensor& old_compact) { return recut_(old_compact); }

  // Listeners live until removed (an optimizer removes its own when destroyed).
  int add_listener(Listener listener);
  void remove_listener(int id);

  // Called by the optimizer after every step() (DDP all-gathers the updated shards there).
  void set_after_step(std::function<void()> hook) { after_step_ = std::move(hook); }
  void after_step() {
    if (after_step_) after_step_();
  }
  // Called by the optimizer within step() once owned()[k] is updated, in order (DDP starts that
  // shard's all-gather there, so it overlaps the update of the next: ddp/reducer.h).
  void set_after_range(std::function<void(size_t)> hook) { after_range_ = std::move(hook); }
  void after_range(size_t k) {
    if (after_range_) after_range_(k);
  }

  // Layout version: bumped by every lay_out.
  int64_t version() const { return version_; }

 private:
  FlatStore(std::vector<Parameter*> params, bool lay_out_now);

  std::vector<Parameter*> params_;
  Device device_;
  std::vector<int64_t> offsets_;
  int64_t size_ = 0;
  Tensor values_, grads_;
  std::vector<FlatRange> owned_;
  bool grads_lent_ = false;
  bool grads_sharded_ = false;
  Tensor owned_grads_;
  size_t lent_bytes_ = 0;
  std::vector<std::pair<int, Listener>> listeners_;
  int next_listener_ = 0;
  std::function<void()> after_step_;
  std::function<void(size_t)> after_range_;
  Recut recut_;
  int64_t version_ = 0;
};

// Reverse parameter order, each parameter starting on a 16-float boundary: the layout a store
// starts with.
std::vector<int64_t> default_flat_offsets(const std::vector<Parameter*>& params, int64_t* size);

// Calls run(range, first_param_of_run) for each maximal run of the parameters that intersect
// `range` whose key(i) is equal and not nullopt (a parameter to skip), in flat order: one
// launch per run covers the gaps between its parameters (zeros, Note [Flat store]).
struct FlatRun {
  FlatRange range;
  size_t first_param;
};
template <class Key>
std::vector<FlatRun> flat_runs(const FlatStore& store, const std::vector<size_t>& flat_order, FlatRange range,
                               const std::function<std::optional<Key>(size_t)>& key);

// The parameter indices sorted by offset.
std::vector<size_t> flat_order(const FlatStore& store);


template <class Key>
std::vector<FlatRun> flat_runs(const FlatStore& store, const std::vector<size_t>& order, FlatRange range,
                               const std::function<std::optional<Key>(size_t)>& key) {
  std::vector<FlatRun> runs;
  std::optional<Key> current;
  for (size_t i : order) {
    const int64_t b = std::max(range.begin, store.offset(i));
    const int64_t e = std::min(range.end, store.offset(i) + store.params()[i]->value.numel());
    if (b >= e) continue;
    std::optional<Key> k = key(i);
    if (!k) {
      current.reset();
      continue;
    }
    if (current && *current == *k) {
      runs.back().range.end = e;
      continue;
    }
    current = k;
    runs.push_back({{b, e}, i});
  }
  return runs;
}

}  // namespace dtrain
