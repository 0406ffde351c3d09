// DistributedDataParallel: wraps a Module so N processes train one model. At construction it
// checks that every rank has the same parameters (names, shapes, order) and broadcasts
// parameters and buffers from rank 0; backward() runs the module's backward while the Reducer
// all-reduces gradient buckets as they fill, and returns with averaged gradients.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/runtime.h"
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

  Tensor forward(const Tensor& input);
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

  Module& module() { return module_; }
  Reducer& reducer() { return *reducer_; }
  const BackwardTiming& last_backward() const { return timing_; }

 private:
  Module& module_;
  Communicator& comm_;
  std::unique_ptr<Reducer> reducer_;
  Tensor scaled_grad_output_;  // the loss gradient / world size
  bool sync_ = true;
  BackwardTiming timing_;
};

// The collective check behind the constructor, exposed for tests: throws dtrain::Error on
// every rank if any rank's parameter list differs from rank 0's; the message on a differing
// rank names the first difference.
void verify_same_model_on_all_ranks(Module& module, Communicator& comm);

}  // namespace dtrain
