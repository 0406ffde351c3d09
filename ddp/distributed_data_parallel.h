// DistributedDataParallel: wraps a Module so N processes train one model. At construction it
// checks that every rank has the same parameters (names, shapes, order) and broadcasts
// parameters (one collective over the flat store, Note [Flat store] in model/flat_store.h) and
// buffers from rank 0; backward() runs the module's backward while the Reducer
// all-reduces gradient buckets as they fill, and returns with averaged gradients.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "comm/runtime.h"
#include "ddp/bucket_cap_tuner.h"
#include "ddp/reducer.h"
#include "model/module.h"

namespace dtrain {

struct DdpOptions {
  size_t bucket_cap_bytes = kDefaultBucketCapBytes;
  size_t first_bucket_bytes = kDefaultFirstBucketBytes;
  // A parameter without a gradient in a backward counts as ready with a zero gradient (without
  // it, such a backward is an error naming the parameter, not a hang).
  bool find_unused_parameters = false;
  CommHookKind comm_hook = CommHookKind::kAllreduce;
  // Note [Rebuilding buckets] (ddp/reducer.h): after the first synced backward, regroup the
  // buckets in the order rank 0's gradients became ready (off: keep reverse parameter order;
  // never with find_unused_parameters, whose unused gradients have no order).
  bool rebuild_buckets = true;
  // Note [Bucket cap autotuning] (ddp/bucket_cap_tuner.h): try the candidates over the steps
  // after the first and keep the fastest; bucket_cap_bytes and first_bucket_bytes then only
  // shape the first step.
  bool bucket_cap_auto = false;
  std::vector<BucketCaps> autotune_candidates = default_bucket_cap_candidates();
  int autotune_warmup_steps = 1;
  int autotune_measured_steps = 8;
  // Test hook: the time a trial step is taken to have cost, from (candidate index, the measured
  // ms); unset, the measured time. Lets a test give ranks different fastest candidates.
  std::function<double(size_t, double)> autotune_step_ms;
  // last_backward()'s all-reduce times from the device where the communicator times on it
  // (NCCL: Note [Device-timed collectives] in comm/communicator.h). The host then waits for a
  // step's all-reduces before it queues the optimizer step; for --trace and --metrics.
  bool device_timing = false;
  // Note [ZeRO shards] (ddp/zero_plan.h): 1 shards the optimizer state (each rank updates its
  // chunk of every bucket, then the values are all-gathered), 2 also reduce-scatters the
  // gradients during backward (the compression hooks reduce-scatter their 16-bit words: Note
  // [Compressed reduce-scatter] in ddp/comm_hook.cpp). With the bucket rebuild and bucket_cap_auto, whose new buckets
  // re-cut the chunks, optimizer state included (Note [Re-cutting sharded state] in
  // model/flat_store.h).
  int zero_stage = 0;
  // Note [Buffer broadcast]: the source rank's buffers (BatchNorm's running statistics) are
  // broadcast before each step's first training forward (PyTorch's broadcast_buffers=True).
  bool broadcast_buffers = true;
  // Note [SyncBatchNorm] (model/batchnorm.h): the module's BatchNorms take their training
  // statistics over every rank, through the gradient communicator (convert_sync_batchnorm).
  bool sync_batchnorm = false;
  // ZeRO-2: the ring of bucket buffers or the whole local gradient (Note [ZeRO-2 gradient ring]
  // in ddp/reducer.h); kWhole with no_sync (gradient accumulation).
  GradientRing gradient_ring = GradientRing::kAuto;
};

// The last synced backward, in steady_now_ns(): backward from start to end, then the wait for
// the remaining all-reduces until `synced`; each bucket's all-reduce. For traces and tests.
struct BackwardTiming {
  int64_t start_ns = 0, end_ns = 0, synced_ns = 0;
  std::vector<BucketTiming> buckets;
};

class DistributedDataParallel {
 public:
  // Gradients move over the runtime's gradient communicator, ordered after its compute stream;
  // the model check runs over its control communicator.
  DistributedDataParallel(Module& module, Runtime& runtime, DdpOptions options = {});
  // The same with each part named: `gradients` reduces gradients and broadcasts parameters
  // (device memory: MPI on CPU, NCCL on GPU), `control` checks that the ranks hold the same model
  // (host memory), `compute` is the stream backward runs on.
  DistributedDataParallel(Module& module, Communicator& gradients, Communicator& control, Stream& compute,
                          DdpOptions options = {});
  ~DistributedDataParallel();

  // The module's forward, after the buffer broadcast (Note [Buffer broadcast]) when it is due.
  Tensor forward(const Tensor& input);
  // Join (ddp/join.h): the rank whose buffers the next broadcast sends, the highest rank that
  // still has data (PyTorch's rule under Join; without Join it is rank 0). Every rank sets the
  // same one each step.
  void set_buffer_source(int rank) { buffer_source_ = rank; }
  // A joined rank's side of the step's buffer broadcast (PyTorch's join hook), in place of forward().
  void join_forward();
  // Backward of the wrapped module from the loss gradient; gradients are averaged over ranks
  // on return (accumulated locally only, inside no_sync()).
  void backward(const Tensor& grad_output);

  // Join (uneven inputs; ddp/join.h): a rank that has run out of data calls this instead of
  // forward and backward. It all-reduces zero gradients through every bucket, so the ranks that
  // still have data are not left waiting, and its gradients become the same average they get:
  // the sum over the ranks with data divided by the world size (PyTorch's Join with
  // divide_by_initial_world_size). Its optimizer step then keeps its replica equal to theirs.
  void join_backward();

  // Gradient accumulation: backward() inside the guard's lifetime skips the all-reduce; the
  // next backward outside it reduces everything accumulated (PyTorch's no_sync()).
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp) : ddp_(ddp), previous_(ddp.sync_) { ddp_.sync_ = false; }
    ~NoSyncGuard() { ddp_.sync_ = previous_; }  // nested guards restore the outer state
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  // The buckets: final once rebuilt after the first step (and, with bucket_cap_auto, once the
  // trial steps have chosen a cap), or once set from a checkpoint. A final layout is what a
  // checkpoint saves so that a resumed run reduces through the same buckets.
  const BucketLayout& bucket_layout() const { return reducer_->layout(); }
  bool bucket_layout_final() const { return layout_final_; }
  // Every rank, with the same layout (from a checkpoint): used from now on, no rebuild and no
  // trials. Throws when it does not fit the model.
  void set_bucket_layout(const BucketLayout& layout);
  // What changed the buckets since the last call, one line each ("buckets: ..."), for the log;
  // nothing when the first step's order stood and no cap was tuned.
  std::vector<std::string> take_bucket_notes() { return std::exchange(notes_, {}); }

  Module& module() { return module_; }
  Reducer& reducer() { return *reducer_; }
  const BackwardTiming& last_backward() const { return timing_; }

 private:
  // After every synced backward (join's too, so all ranks take the same steps): the rebuild
  // after the first, then the tuner's trials. Collective over the control communicator.
  void after_synced_backward(int64_t backward_ns);
  // DdpOptions::device_timing: timing_'s device-timed all-reduces get the device's times.
  void read_device_times();
  // Every rank: `source`'s buffers, in one broadcast each.
  void broadcast_buffers(int source);
  void use_layout(const BucketLayout& layout);
  void finish_tuning();

  Module& module_;
  Communicator& comm_;
  Communicator& control_;
  Stream& compute_;
  DdpOptions options_;
  bool order_agreed_ = false;  // the first synced backward has happened
  bool layout_final_ = false;
  int64_t synced_steps_ = 0;
  std::optional<BucketCapTuner> tuner_;
  std::vector<std::string> notes_;
  std::unique_ptr<Reducer> reducer_;
  Tensor scaled_grad_output_;  // the loss gradient / world size
  bool sync_ = true;
  // Note [Buffer broadcast]: the next forward broadcasts (the one after a synced forward).
  bool buffers_due_ = true;
  int buffer_source_ = 0;
  BackwardTiming timing_;
};

// The collective check behind the constructor, exposed for tests: throws dtrain::Error on
// every rank if any rank's parameter list differs from rank 0's; the message on a differing
// rank names the first difference.
void verify_same_model_on_all_ranks(Module& module, Communicator& comm);

}  // namespace dtrain
