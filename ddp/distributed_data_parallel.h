// DistributedDataParallel: wraps a Module so N processes train one model. At construction it
// checks that every rank has the same parameters (names, shapes, order) and broadcasts
// parameters and buffers from rank 0; backward() runs the module's backward while the Reducer
// all-reduces gradient buckets as they fill, and returns with averaged gradients.
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "ddp/reducer.h"
#include "ddp/trace.h"
#include "model/module.h"

namespace dtrain {

struct DdpOptions {
  size_t bucket_cap_bytes = kDefaultBucketCapBytes;
  size_t first_bucket_bytes = kDefaultFirstBucketBytes;
  bool find_unused_parameters = false;
  std::string comm_hook = "allreduce";  // "allreduce" | "bf16" | "fp16"
};

class DistributedDataParallel {
 public:
  // `comm` reduces gradients and broadcasts parameters (device memory: MPI on CPU, NCCL on GPU);
  // `control` runs the model check on host memory (defaults to `comm`; pass the MPI communicator
  // when `comm` is NCCL).
  DistributedDataParallel(Module& module, Communicator& comm, DdpOptions options = {}, Tracer* tracer = nullptr,
                          Stream* compute = nullptr, Communicator* control = nullptr);
  ~DistributedDataParallel();

  Tensor forward(const Tensor& input);
  // Backward of the wrapped module from the loss gradient; gradients are averaged over ranks
  // on return (accumulated locally only, inside no_sync()).
  void backward(const Tensor& grad_output);

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

 private:
  Module& module_;
  Communicator& comm_;
  Tracer* tracer_;
  std::unique_ptr<Reducer> reducer_;
  Tensor scaled_grad_output_;  // the loss gradient / world size
  bool sync_ = true;
};

// The collective check behind the constructor, exposed for tests: throws dtrain::Error on
// every rank if any rank's parameter list differs from rank 0's; the message on a differing
// rank names the first difference.
void verify_same_model_on_all_ranks(Module& module, Communicator& comm);

}  // namespace dtrain
