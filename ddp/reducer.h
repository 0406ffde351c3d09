// Reducer: the trigger and completion of gradient synchronisation (PyTorch's reducer split:
// the plan is ddp/bucket_plan.h, the state ddp/grad_bucket.h, the reduction ddp/comm_hook.h).
//
// Note [Launch order]: a bucket whose gradients are all ready is launched only when every
// lower-numbered bucket has been launched, so every rank issues the same collectives in the
// same order whatever order its gradients arrive in.
//
// Note [Stream ordering]: launching a bucket hands the hook the compute stream, and the hook's
// all-reduce is ordered after it there (an event recorded on the compute stream, the
// communication stream waits on it: Note [Ordering a collective after its producer] in
// comm/communicator.h, the one place that is done); finalize() makes the compute stream wait on
// each all-reduce (Work::wait). On CUDA no host thread blocks inside backward; on CPU the
// events are complete when recorded and MPI's wait blocks until the comm thread is done.
//
// Note [Rebuilding buckets]: the first plan assumes gradients arrive in reverse parameter order,
// which holds for a chain of layers but not for a model with branches or a layer that produces
// its gradients in another order; a bucket whose last gradient comes late then holds back every
// later bucket (Note [Launch order]). So the reducer records the order gradients became ready in
// a synced backward, and DistributedDataParallel rebuilds the buckets once, after the first step,
// in the order rank 0 saw (PyTorch's Reducer::rebuild_buckets): every rank then issues the same
// collectives. All buckets are slices of one flat gradient storage allocated once (from the
// communicator: on one node, MPI's shared window), so a rebuild only re-slices it and copies the
// gradients to their new places (through one temporary copy of the storage): no new buffer for
// the communicator, no collective, and the values are unchanged. The storage is the gradient
// buffer of the parameters' flat store (Note [Flat store] in model/flat_store.h): the same
// layout moves the values and the optimizer's state, so an optimizer step is one launch per
// owned range. Under ZeRO (Note [ZeRO shards] in ddp/zero_plan.h) the buckets are padded to a
// multiple of the world size and the store's owned ranges are this rank's chunks; under ZeRO-2
// a rebuild first all-gathers the reduced chunks, since a new chunk covers elements another rank
// reduced, and the optimizer's state for the new chunks is re-cut from every rank's old ones,
// one old bucket at a time (Note [Re-cutting sharded state] in model/flat_store.h): so the
// layout may change after optimizer steps too, as --bucket-cap-mb auto's trials change it.
//
// Note [ZeRO-2 gradient ring]: DeepSpeed's stage 2 keeps only the rank's shard of the reduced
// gradient, so a rank holds 4Psi/N bytes of gradients plus a few bucket buffers, not 4Psi. Here:
// the flat store keeps no flat gradient (FlatStore::lend_grads); the reduced chunks live back to
// back in `owned_grads_` (the optimizer state's index space). During backward a bucket borrows a
// slot of a ring of bucket-sized buffers the moment one of its parameters is about to be written
// (Parameter::before_grad_write, called by take_grad_beta), and every parameter of the bucket is
// pointed at its place in that slot, so backward still writes straight into the buffer the
// collective sends. The bucket's reduce-scatter delivers this rank's chunk into owned_grads_
// (out of place); its slot is free again once that collective is waited for. A bucket that finds
// no free slot waits for the oldest launched bucket holding one (launched buckets complete:
// every rank launches in the same order), and when every slot is held by a bucket not yet
// launched (a gradient written long before its bucket is ready: GPT's tied embedding, written by
// the head at the start of backward and ready at its end) the ring grows by one slot, kept for
// the next steps. Two slots: one being written, one being reduced. The slots are ordinary memory,
// not the communicator's shared window: which slot a bucket gets may differ between ranks (a
// joined rank's shadow backward), and the shared-memory reduce-scatter reads the peers' copies at
// this rank's offset only for buffers inside its window. The sums are the same either way
// (bitwise DDP's, Note [ZeRO shards]). Not with no_sync (GradientRing::kWhole): accumulation
// adds the micro-batches locally before one reduction, which needs the whole local gradient
// (DeepSpeed reduces every micro-batch instead, which is not DDP's order of sums). Nor, unless
// asked (kRing), where the two slots and the owned chunks would hold more than the whole local
// gradient: a bucket holds at least one whole parameter, so a small model in few buckets keeps
// its whole gradient (as before the ring; decided once, from the first layout, counting two
// slots). The GPT's tied embedding needs no third: its bucket holds one slot all backward and the
// others take turns in the second, each waiting for the one before to be reduced (less overlap,
// not more memory; mpi_zero_test pins it). A model that writes two buckets' gradients
// interleaved would grow the ring, which kAuto does not foresee (the memory report counts the
// grown slot from then on).
// A rebuild re-cuts owned_grads_ one old bucket at a time (an all-gather into a bucket-sized
// buffer): no rank ever holds the whole gradient.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm/communicator.h"
#include "core/stream.h"
#include "ddp/bucket_plan.h"
#include "ddp/comm_hook.h"
#include "ddp/grad_bucket.h"
#include "ddp/zero_plan.h"
#include "model/module.h"

namespace dtrain {

// ZeRO-2's gradients (Note [ZeRO-2 gradient ring]): kAuto lends the ring where it holds less
// than the whole local gradient; kWhole keeps the whole local gradient (no_sync accumulation
// needs it); kRing always lends it (tests).
enum class GradientRing { kAuto, kWhole, kRing };

struct ReducerOptions {
  size_t first_bucket_bytes = kDefaultFirstBucketBytes;
  size_t bucket_cap_bytes = kDefaultBucketCapBytes;
  bool find_unused_parameters = false;
  // 0: all-reduce every bucket; 1: the same, and this rank's optimizer owns its chunks; 2: the
  // buckets are reduce-scattered into the chunks (Note [ZeRO shards] in ddp/zero_plan.h).
  int zero_stage = 0;
  GradientRing gradient_ring = GradientRing::kAuto;  // ZeRO-2 only
};

// When one bucket's all-reduce was launched (from a hook or finalize), started and finished on
// the communication side, in steady_now_ns(); for traces and tests.
struct BucketTiming {
  size_t bucket = 0;
  size_t bytes = 0;
  int64_t launched_ns = 0, started_ns = 0, finished_ns = 0;
  // A device-timed collective (Note [Device-timed collectives] in comm/communicator.h): its
  // times are known once it ran; DistributedDataParallel reads them when asked to.
  WorkHandle device_work = nullptr;
};

// What the reducer did, for tests and traces (instrumentation, not timing).
struct ReducerStats {
  int64_t synced_backwards = 0;
  int64_t buckets_launched_during_backward = 0;  // from a gradient hook, before backward returned
  int64_t buckets_launched_in_finalize = 0;
};

class Reducer {
 public:
  // `compute` is the stream backward runs on (tests pass a recording stream).
  Reducer(std::vector<Parameter*> params, Communicator& comm, std::unique_ptr<CommHook> hook, ReducerOptions options,
          Stream& compute);

  void prepare_for_backward(bool sync);  // sync == false inside no_sync: gradients only accumulate
  void mark_ready(Parameter& param);     // the gradient-ready hook
  void mark_all_ready();                 // every parameter, in parameter order
  // Join's shadow backward: every gradient zeroed and marked ready, bucket by bucket.
  void zero_and_mark_all_ready();
  void finalize_backward();              // after backward: launch the rest, wait, averaged grads
  // After a failed backward: waits for every launched all-reduce (errors ignored: the caller
  // is already failing) so none writes into freed buffers, and resets for the next backward.
  // Every rank launches buckets in the same order, so the peers' matching collectives exist.
  void abort_backward() noexcept;
  ~Reducer();

  // Note [Rebuilding buckets]. Regroups the buckets by `layout` between two backwards, keeping
  // every gradient's value; the caller has synchronised the compute stream. Throws when the
  // layout's order is not a permutation of the parameters.
  void apply_layout(const BucketLayout& layout);
  const BucketLayout& layout() const { return layout_; }
  // The plan `layout` gives this reducer's parameters, and its description ("2 buckets: ...").
  std::vector<std::vector<size_t>> plan_for(const BucketLayout& layout) const;
  std::string describe(const BucketLayout& layout) const;
  // The order this rank's gradients became ready in the last synced backward (empty when some
  // parameter produced none: unused parameters give no order to rebuild from).
  std::vector<size_t> observed_order() const;

  const std::vector<GradBucket>& buckets() const { return buckets_; }
  FlatStore& store() { return *store_; }
  // This rank's chunk of every bucket (ZeRO), or every bucket whole.
  const std::vector<ZeroChunk>& chunks() const { return chunks_; }
  // Note [Overlapped all-gather]: after a ZeRO optimizer step the updated chunks of the
  // parameter values are all-gathered in place, one collective per bucket. The optimizer reports
  // each owned range (a chunk, in bucket order) as soon as it is updated (FlatStore::after_range),
  // and that bucket's all-gather starts at once, so it runs while the next chunk is updated
  // instead of after the whole step; gather_updated_values (the after-step hook) starts any not
  // yet started, in bucket order, and waits for all. Copies only: the bits are those of one
  // all-gather after the step. No-op without ZeRO.
  void updated_range(size_t owned_range);
  void gather_updated_values();
  const ReducerStats& stats() const { return stats_; }
  // Every bucket of the last synced backward, in launch order.
  const std::vector<BucketTiming>& last_timings() const { return timings_; }

 private:
  void launch_ready_buckets();  // Note [Launch order]
  void launch(GradBucket& bucket);
  // Note [ZeRO-2 gradient ring]: bucket k borrows a slot and its parameters' gradients point
  // into it (no-op when it holds one, or outside a synced backward).
  void borrow_slot(size_t k);
  void return_slots();
  void gather_bucket_values(size_t k);  // starts bucket k's all-gather, once per step
  // A layout's shards under ZeRO: its flat layout, buckets, this rank's chunks, where each
  // chunk starts in the compact arrays (owned gradients, optimizer state) and their size.
  struct ShardCut {
    FlatLayout flat;
    std::vector<std::vector<size_t>> plan;
    std::vector<ZeroChunk> chunks;
    std::vector<int64_t> chunk_at;
    int64_t size = 0;
  };
  // Note [Re-cutting sharded state] (model/flat_store.h): `compact` (this rank's chunks of
  // `from`, back to back) as this rank's chunks of `to`. Collective: one all-gather per bucket
  // of `from`.
  Tensor recut(const Tensor& compact, const ShardCut& from, const ShardCut& to);

  std::vector<Parameter*> params_;
  Communicator& comm_;
  std::unique_ptr<CommHook> hook_;
  ReducerOptions options_;
  Stream& compute_;
  std::vector<size_t> param_bytes_;
  Tensor storage_;                           // every bucket's buffer is a slice of it
  Tensor value_storage_;                     // ZeRO: the parameters' values, from the communicator
  std::shared_ptr<FlatStore> store_;
  std::vector<ZeroChunk> chunks_;
  std::vector<size_t> owned_bucket_;        // per owned range of the store: its bucket
  std::vector<WorkHandle> gathers_;         // per bucket: its values' all-gather this step
  // Note [ZeRO-2 gradient ring]
  bool ring_ = false;
  FlatLayout flat_;
  std::vector<int64_t> chunk_at_;   // per bucket: where its chunk starts in owned_grads_
  Tensor owned_grads_;
  std::vector<Tensor> slots_;       // each of slot_floats_ elements
  int64_t slot_floats_ = 0;
  std::vector<int> slot_holder_;    // per slot: the bucket that borrowed it, -1: free
  std::vector<int> slot_of_;        // per bucket: its slot in this backward, -1: none
  BucketLayout layout_;
  std::vector<GradBucket> buckets_;
  std::unordered_map<const Parameter*, size_t> index_of_;
  std::vector<size_t> bucket_of_;            // parameter index -> bucket
  std::vector<int64_t> param_offset_;        // parameter index -> its gradient's offset in storage_
  std::vector<bool> ready_;                  // this backward
  std::vector<bool> used_since_sync_;        // any backward since the last synced one (no_sync)
  std::vector<size_t> ready_order_;          // the current or last synced backward's, from its hooks
  size_t next_to_launch_ = 0;
  bool sync_ = true;
  bool in_backward_ = false;
  ReducerStats stats_;
  std::vector<BucketTiming> timings_;
};

}  // namespace dtrain
