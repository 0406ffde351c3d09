#include "ddp/sync_batchnorm.h"

#include "core/error.h"

namespace dtrain {

void CommBatchStatsSync::allgather(const Tensor& mine, Tensor& all) {
  DTRAIN_CHECK(all.numel() == mine.numel() * comm_.size(), "SyncBatchNorm: gathering {} into {}", mine.numel(),
               all.numel());
  order_after(compute_, comm_);  // the statistics kernels wrote `mine`
  comm_.allgather(mine.raw(), all.raw(), mine.numel(), mine.dtype());
}

void CommBatchStatsSync::allreduce_sum(Tensor& t) {
  order_after(compute_, comm_);
  comm_.allreduce(t.raw(), t.numel(), t.dtype(), ReduceOp::kSum);
}

void convert_sync_batchnorm(Module& module, Communicator& comm, Stream& compute) {
  module.set_batch_stats_sync(std::make_shared<CommBatchStatsSync>(comm, compute));
}

}  // namespace dtrain
