#include "ddp/comm_hook.h"

#include <unordered_map>

#include "core/error.h"
#include "core/named_enum.h"
#include "core/kernels.h"

namespace dtrain {

namespace {

// ZeRO-2's reduction: each rank gets the sum of its chunk, in place (Note [ZeRO shards] in
// ddp/zero_plan.h), ordered after the producer as allreduce_after orders an all-reduce.
WorkHandle reduce_scatter_after(Stream& producer, Communicator& comm, float* buf, int64_t per_rank, float* out) {
  order_after(producer, comm);
  return comm.reduce_scatter_async(buf, out ? out : buf + comm.rank() * per_rank, per_rank, DType::kF32, ReduceOp::kSum);
}

class AllreduceHook final : public CommHook {
 public:
  WorkHandle run(GradBucket& bucket, Communicator& comm, Stream& producer) override {
    if (bucket.shard_elements > 0)
      return reduce_scatter_after(producer, comm, bucket.buffer.data(), bucket.shard_elements, bucket.shard_out);
    return allreduce_after(producer, comm, bucket.buffer.raw(), bucket.buffer.numel(), DType::kF32, ReduceOp::kSum);
  }
  std::string name() const override { return "allreduce"; }
};

// Waits for the 16-bit reduction, then unpacks `n` words of `wire` from `from` into `to` (the
// bucket, or under ZeRO-2 this rank's chunk of it) on the compute stream.
class UnpackWork final : public Work {
 public:
  UnpackWork(WorkHandle inner, Tensor wire, int64_t from, float* to, int64_t n)
      : inner_(std::move(inner)), wire_(std::move(wire)), from_(from), to_(to), n_(n) {}
  void wait() override {
    if (done_) return;
    inner_->wait();
    const uint16_t* src = wire_.data_as<uint16_t>() + from_;
    if (wire_.dtype() == DType::kBF16)
      launch(wire_.device(), n_, kernels::UnpackBF16{to_, src});
    else
      launch(wire_.device(), n_, kernels::UnpackFP16{to_, src});
    done_ = true;
  }
  bool test() override {
    if (!done_ && inner_->test()) wait();  // the data is there: unpack (never blocks)
    return done_;
  }
  // The 16-bit reduction's times (the unpack is compute).
  int64_t started_ns() const override { return inner_->started_ns(); }
  int64_t finished_ns() const override { return inner_->finished_ns(); }
  bool device_timed() const override { return inner_->device_timed(); }
  void wait_for_device_times() override { inner_->wait_for_device_times(); }

 private:
  WorkHandle inner_;
  Tensor wire_;
  int64_t from_;
  float* to_;
  int64_t n_;
  bool done_ = false;
};

// Note [Compressed reduce-scatter]: under ZeRO-2 the 16-bit words are reduce-scattered instead
// of all-reduced (DeepSpeed's fp16 reduce-scatter): a quarter of the float32 all-reduce's bytes
// reach this rank, and only its chunk is unpacked (into the owned gradients under the ring).
// Each element is the same 16-bit sum of the same packed words as the 16-bit all-reduce's, so
// the two agree bit for bit where the backend adds the ranks in the same order (always at two
// ranks; MPI's algorithms for 16-bit words may pair them otherwise at three or more:
// tests/mpi/zero_test.cpp).
class CompressHook final : public CommHook {
 public:
  explicit CompressHook(DType wire) : wire_dtype_(wire) {
    DTRAIN_CHECK(wire == DType::kBF16 || wire == DType::kF16, "compression to {}", dtype_name(wire));
  }
  WorkHandle run(GradBucket& bucket, Communicator& comm, Stream& producer) override {
    Tensor& wire = wire_buffers_[bucket.index];  // one 16-bit buffer per bucket, reused every step
    ensure_tensor(wire, bucket.buffer.shape(), bucket.buffer.device(), wire_dtype_);
    // The bucket is already divided by the world size (Note [Averaging folded into backward]),
    // so the 16-bit sum cannot overflow where the float32 average would not.
    if (wire_dtype_ == DType::kBF16)
      launch(wire.device(), wire.numel(), kernels::PackBF16{wire.data_as<uint16_t>(), bucket.buffer.data(), 1.f});
    else
      launch(wire.device(), wire.numel(), kernels::PackFP16{wire.data_as<uint16_t>(), bucket.buffer.data(), 1.f});
    // The pack is queued on the producer (compute) stream: the collective is ordered after it.
    if (bucket.shard_elements > 0) {
      const int64_t n = bucket.shard_elements, at = comm.rank() * n;
      order_after(producer, comm);
      WorkHandle inner = comm.reduce_scatter_async(wire.data_as<uint16_t>(), wire.data_as<uint16_t>() + at, n,
                                                   wire_dtype_, ReduceOp::kSum);
      float* out = bucket.shard_out ? bucket.shard_out : bucket.buffer.data() + at;
      return std::make_shared<UnpackWork>(std::move(inner), wire, at, out, n);
    }
    WorkHandle inner = allreduce_after(producer, comm, wire.raw(), wire.numel(), wire_dtype_, ReduceOp::kSum);
    return std::make_shared<UnpackWork>(std::move(inner), wire, 0, bucket.buffer.data(), bucket.buffer.numel());
  }
  std::string name() const override { return wire_dtype_ == DType::kBF16 ? "bf16" : "fp16"; }
  void buckets_changed() override { wire_buffers_.clear(); }  // else old sizes stay allocated

 private:
  DType wire_dtype_;
  std::unordered_map<size_t, Tensor> wire_buffers_;
};

}  // namespace

std::unique_ptr<CommHook> make_allreduce_hook() { return std::make_unique<AllreduceHook>(); }

std::unique_ptr<CommHook> make_compress_hook(DType wire_dtype) { return std::make_unique<CompressHook>(wire_dtype); }

namespace {
constexpr auto kCommHooks = enum_names<CommHookKind>(std::pair{CommHookKind::kAllreduce, "allreduce"},
                                                     std::pair{CommHookKind::kBf16, "bf16"},
                                                     std::pair{CommHookKind::kFp16, "fp16"});
}  // namespace

const char* comm_hook_name(CommHookKind kind) { return kCommHooks.name(kind); }
std::optional<CommHookKind> parse_comm_hook_kind(const std::string& name) { return kCommHooks.parse(name); }

std::unique_ptr<CommHook> make_comm_hook(CommHookKind kind) {
  switch (kind) {
    case CommHookKind::kBf16: return make_compress_hook(DType::kBF16);
    case CommHookKind::kFp16: return make_compress_hook(DType::kF16);
    case CommHookKind::kAllreduce: break;
  }
  return make_allreduce_hook();
}

}  // namespace dtrain
