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

// Waits for the 16-bit all-reduce, then unpacks into the float32 bucket on the compute stream.
class UnpackWork final : public Work {
 public:
  UnpackWork(WorkHandle inner, Tensor wire, Tensor bucket) : inner_(std::move(inner)), wire_(std::move(wire)),
                                                             bucket_(std::move(bucket)) {}
  void wait() override {
    if (done_) return;
    inner_->wait();
    const uint16_t* src = wire_.data_as<uint16_t>();
    if (wire_.dtype() == DType::kBF16)
      launch(bucket_.device(), bucket_.numel(), kernels::UnpackBF16{bucket_.data(), src});
    else
      launch(bucket_.device(), bucket_.numel(), kernels::UnpackFP16{bucket_.data(), src});
    done_ = true;
  }
  bool test() override {
    if (!done_ && inner_->test()) wait();  // the data is there: unpack (never blocks)
    return done_;
  }
  // The 16-bit all-reduce's times (the unpack is compute).
  int64_t started_ns() const override { return inner_->started_ns(); }
  int64_t finished_ns() const override { return inner_->finished_ns(); }
  bool device_timed() const override { return inner_->device_timed(); }
  void wait_for_device_times() override { inner_->wait_for_device_times(); }

 private:
  WorkHandle inner_;
  Tensor wire_, bucket_;
  bool done_ = false;
};

class CompressHook final : public CommHook {
 public:
  explicit CompressHook(DType wire) : wire_dtype_(wire) {
    DTRAIN_CHECK(wire == DType::kBF16 || wire == DType::kF16, "compression to {}", dtype_name(wire));
  }
  WorkHandle run(GradBucket& bucket, Communicator& comm, Stream& producer) override {
    DTRAIN_CHECK(bucket.shard_elements == 0, "the {} compression hook does not reduce-scatter (ZeRO-2)", name());
    Tensor& wire = wire_buffers_[bucket.index];  // one 16-bit buffer per bucket, reused every step
    ensure_tensor(wire, bucket.buffer.shape(), bucket.buffer.device(), wire_dtype_);
    // The bucket is already divided by the world size (Note [Averaging folded into backward]),
    // so the 16-bit sum cannot overflow where the float32 average would not.
    if (wire_dtype_ == DType::kBF16)
      launch(wire.device(), wire.numel(), kernels::PackBF16{wire.data_as<uint16_t>(), bucket.buffer.data(), 1.f});
    else
      launch(wire.device(), wire.numel(), kernels::PackFP16{wire.data_as<uint16_t>(), bucket.buffer.data(), 1.f});
    // The pack is queued on the producer (compute) stream: the all-reduce is ordered after it.
    WorkHandle inner = allreduce_after(producer, comm, wire.raw(), wire.numel(), wire_dtype_, ReduceOp::kSum);
    return std::make_shared<UnpackWork>(std::move(inner), wire, bucket.buffer);
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
