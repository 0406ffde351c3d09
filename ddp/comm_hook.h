// Communication hooks: how a ready bucket becomes the average over ranks.
//
// Note [Averaging folded into backward]: DistributedDataParallel scales the loss gradient by
// 1/world_size before backward; every parameter gradient is linear in it, so buckets arrive
// already divided and a hook only sums. That costs one pass over the logits' gradient instead
// of one over every bucket.
//
// The default hook all-reduces float32 with ReduceOp::kSum. The compression hooks (PyTorch's
// bf16/fp16_compress_hook) pack the bucket to 16 bits, all-reduce the 16-bit words (half the
// bytes), and unpack into the bucket when the work is waited on; under ZeRO-2 they
// reduce-scatter the 16-bit words (Note [Compressed reduce-scatter] in comm_hook.cpp).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "comm/communicator.h"
#include "ddp/grad_bucket.h"

namespace dtrain {

class CommHook {
 public:
  virtual ~CommHook() = default;
  // Starts the reduction of `bucket.buffer` (pre-divided, see the Note), which `producer` (the
  // compute stream) wrote; after the returned work's wait() the buffer holds the average over
  // ranks (ZeRO-2, bucket.shard_elements > 0: this rank's chunk, or bucket.shard_out when set, holds the sum
  // over ranks of its chunk). Every collective is ordered after `producer` here (Note [Ordering a collective after
  // its producer] in comm/communicator.h): allreduce_after, or its reduce-scatter twin.
  virtual WorkHandle run(GradBucket& bucket, Communicator& comm, Stream& producer) = 0;
  virtual std::string name() const = 0;
  // The buckets were regrouped (Note [Rebuilding buckets]): drop per-bucket state. Nothing is
  // in flight when it is called.
  virtual void buckets_changed() {}
};

enum class CommHookKind { kAllreduce, kBf16, kFp16 };
const char* comm_hook_name(CommHookKind kind);                           // "allreduce", "bf16", "fp16"
std::optional<CommHookKind> parse_comm_hook_kind(const std::string& name);  // the names above

std::unique_ptr<CommHook> make_allreduce_hook();
std::unique_ptr<CommHook> make_compress_hook(DType wire_dtype);  // kBF16 or kF16
std::unique_ptr<CommHook> make_comm_hook(CommHookKind kind);

}  // namespace dtrain
