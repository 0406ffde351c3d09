// StageZero (see pipeline_zero.h).
#include "app/pipeline_zero.h"

#include <fmt/format.h>

#include "comm/flight_recorder.h"
#include "core/error.h"
#include "ddp/zero_plan.h"

namespace dtrain {

StageZero::StageZero(Module& stage, const PipelineGrid& grid, bool reduce_scatter) : comm_(*grid.data_parallel) {
  const std::vector<Parameter*> params = stage.parameters();
  DTRAIN_CHECK(!params.empty(), "--zero: pipeline stage {} holds no parameters", grid.stage);
  store_ = FlatStore::of(params);
  // One bucket, the parameters in reverse (the order backward finishes them), padded to D.
  std::vector<size_t> order;
  std::vector<int64_t> numel;
  for (size_t i = params.size(); i-- > 0;) order.push_back(i);
  for (const Parameter* p : params) numel.push_back(p->value.numel());
  const int replicas = comm_.size(), replica = comm_.rank();
  const FlatLayout layout = lay_out_buckets({order}, numel, replicas);
  const std::vector<ZeroChunk> chunks = zero_chunks(layout, {order}, numel, replicas, replica);
  begin_ = layout.bucket_begin.at(0);
  per_rank_ = layout.bucket_size.at(0) / replicas;
  store_->lay_out(layout.param_offset, layout.total, {}, {chunks.at(0).range});
  store_->set_after_step([this] { gather_updated_values(); });
  // Beyond its chunk a replica's gradient is its own, not the stage's sum: the norm and the
  // fp16 check (FlatStore::owned_grad_spans) read the chunk only.
  store_->set_grads_sharded(reduce_scatter);
}

StageZero::~StageZero() { store_->set_after_step(nullptr); }

void StageZero::reduce_scatter_gradients() {
  float* bucket = store_->grads().data() + begin_;
  order_after(compute_stream(store_->device()), comm_);
  const ScopedCollectiveDetail detail("ZeRO-2: the stage's gradients");
  comm_.reduce_scatter_async(bucket, bucket + comm_.rank() * per_rank_, per_rank_, DType::kF32, ReduceOp::kSum)->wait();
}

void StageZero::gather_updated_values() {
  // After the update of this replica's chunk: every chunk to every replica, in place.
  float* bucket = store_->values().data() + begin_;
  order_after(compute_stream(store_->device()), comm_);
  const ScopedCollectiveDetail detail("ZeRO-1: the stage's updated parameters");
  comm_.allgather_async(bucket + comm_.rank() * per_rank_, bucket, per_rank_, DType::kF32)->wait();
}

}  // namespace dtrain
