// SyncBatchNorm's collectives (Note [SyncBatchNorm] in model/batchnorm.h) over a Communicator:
// PyTorch's convert_sync_batchnorm for every BatchNorm of a module, on CPU (MPI, shared memory)
// and GPU (NCCL) alike, with the communicator's deadlines and flight recorder.
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "core/stream.h"
#include "model/batchnorm.h"

namespace dtrain {

class CommBatchStatsSync : public BatchStatsSync {
 public:
  // Collectives on `comm`, ordered after the kernels queued on `compute`.
  CommBatchStatsSync(Communicator& comm, Stream& compute) : comm_(comm), compute_(compute) {}
  int ranks() const override { return comm_.size(); }
  void allgather(const Tensor& mine, Tensor& all) override;
  void allreduce_sum(Tensor& t) override;

 private:
  Communicator& comm_;
  Stream& compute_;
};

// Every BatchNorm of `module` takes its training statistics over the ranks of `comm`.
void convert_sync_batchnorm(Module& module, Communicator& comm, Stream& compute);

}  // namespace dtrain
