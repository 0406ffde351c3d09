// NcclCommunicator (see nccl_communicator.h).
#include "comm/nccl/nccl_communicator.h"

#include <atomic>
#include <exception>
#include <mutex>

#include <fmt/format.h>
#include <nccl.h>

#include "comm/nccl/nccl_check.h"
#include "comm/nccl/nccl_watchdog.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_stream.h"
#include "core/error.h"

namespace dtrain {

namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kF32: return ncclFloat32;
    case DType::kI32: return ncclInt32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
    case DType::kU8: return ncclUint8;
    case DType::kI64: return ncclInt64;
  }
  throw Error(fmt::format("NCCL: unsupported dtype {}", static_cast<int>(dtype)));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
  }
  throw Error(fmt::format("NCCL: unsupported reduce op {}", static_cast<int>(op)));
}

// NCCL reads device memory only; a host pointer would fault on the GPU, far from the cause.
void check_device_buffer(const void* ptr, int64_t count, const char* op, const char* which) {
  DTRAIN_CHECK(count >= 0, "NCCL {}: negative count {}", op, count);
  if (count == 0) return;
  DTRAIN_CHECK(cuda::is_device_pointer(ptr), "NCCL {}: {} buffer {} is not GPU memory", op, which, ptr);
}

// Note [Device-timed collectives] (comm/communicator.h): CUDA events time the collective on the
// device; an anchor event, recorded on an idle stream while the host reads the steady clock,
// places them on that clock (cudaEventElapsedTime works across streams of one device). The
// anchor is renewed every kAnchorRenewal so the float milliseconds stay precise (a float keeps
// ~1 us over 10 s).
constexpr int64_t kAnchorRenewalNs = 10'000'000'000;

cuda::EventHandle timing_event() {
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreate(&e));  // default flags: timing enabled
  return cuda::EventHandle(e);
}

struct ClockAnchor {
  cuda::EventHandle event;
  int64_t host_ns = 0;  // steady_now_ns() when the device passed `event`
};

std::shared_ptr<const ClockAnchor> make_clock_anchor(cudaStream_t idle) {
  auto anchor = std::make_shared<ClockAnchor>();
  anchor->event = timing_event();
  const int64_t before = steady_now_ns();
  CUDA_CHECK(cudaEventRecord(anchor->event.get(), idle));
  CUDA_CHECK(cudaEventSynchronize(anchor->event.get()));  // an idle stream: microseconds
  anchor->host_ns = before + (steady_now_ns() - before) / 2;
  return anchor;
}

// The events around one collective on the communication stream.
struct DeviceSpan {
  std::shared_ptr<const ClockAnchor> anchor;
  cuda::EventHandle start, end;

  int64_t at_ns(cudaEvent_t event) const {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, anchor->event.get(), event));
    return anchor->host_ns + static_cast<int64_t>(static_cast<double>(ms) * 1e6);
  }
};

class NcclWork final : public Work {
 public:
  // `finished` is shared with the watchdog's completion callback, so that callback never owns
  // this Work: were it the last owner, ~NcclWork (and with it the watchdog) would run on the
  // watchdog's own thread.
  NcclWork(std::shared_ptr<Event> done, Stream& compute, std::shared_ptr<NcclWatchdog> watchdog, bool host_blocking,
           std::shared_ptr<std::atomic<int64_t>> finished)
      : done_(std::move(done)), compute_(compute), watchdog_(std::move(watchdog)), host_blocking_(host_blocking),
        finished_(std::move(finished)) {
    started_ns_.store(steady_now_ns(), std::memory_order_release);
  }

  void wait() override {
    watchdog_->throw_if_failed();
    compute_.wait(*done_);  // the compute stream's later work sees the result; the host goes on
    if (host_blocking_) {
      done_->synchronize();  // a hang here is the watchdog's to end
      mark_finished();
    }
    watchdog_->throw_if_failed();
  }

  bool test() override {
    watchdog_->throw_if_failed();
    const bool finished = done_->query();
    if (finished) mark_finished();
    return finished;
  }

  bool device_timed() const override { return span_ != nullptr; }
  void wait_for_device_times() override {
    if (!span_ || device_times_known_) return;
    watchdog_->throw_if_failed();
    CUDA_CHECK(cudaEventSynchronize(span_->end.get()));  // a hang here is the watchdog's to end
    started_ns_.store(span_->at_ns(span_->start.get()), std::memory_order_release);
    device_finished_ns_ = span_->at_ns(span_->end.get());
    device_times_known_ = true;
  }
  int64_t finished_ns() const override {
    return device_times_known_ ? device_finished_ns_ : finished_->load(std::memory_order_acquire);
  }
  void set_device_span(std::unique_ptr<DeviceSpan> span) { span_ = std::move(span); }

  void mark_finished() { mark(*finished_); }
  static void mark(std::atomic<int64_t>& finished) {
    int64_t expected = 0;
    finished.compare_exchange_strong(expected, steady_now_ns(), std::memory_order_acq_rel);
  }

 private:
  std::shared_ptr<Event> done_;
  Stream& compute_;
  std::shared_ptr<NcclWatchdog> watchdog_;
  bool host_blocking_;
  std::shared_ptr<std::atomic<int64_t>> finished_;
  std::unique_ptr<DeviceSpan> span_;  // null: not device-timed
  bool device_times_known_ = false;   // wait_for_device_times() ran (on the caller's thread)
  int64_t device_finished_ns_ = 0;
};

}  // namespace

struct NcclCommunicator::Impl {
  int rank = 0, size = 0, local_rank = 0, local_size = 0, device = 0;
  ncclComm_t comm = nullptr;
  Stream* compute = nullptr;  // the caller's compute stream (NcclOptions::compute)
  CollectiveLog* log = nullptr;  // the flight recorder (NcclOptions::log), or null
  std::unique_ptr<cuda::CudaStream> comm_stream;
  bool device_timing = false;  // NcclOptions::device_timing: the rest of these only then
  std::unique_ptr<cuda::CudaStream> anchor_stream;  // idle but for clock anchors
  std::shared_ptr<const ClockAnchor> anchor;
  std::shared_ptr<NcclWatchdog> watchdog;
  void* barrier_buf = nullptr;  // one float on the device, the barrier's all-reduce operand
  std::mutex issue_mutex;       // NCCL needs every rank's collectives in one order: one issuer
  int64_t next_seq = 1;
  int exceptions_at_construction = std::uncaught_exceptions();

  // Issues a collective on the comm stream (the caller ordered that stream after the buffer's
  // producer: Note [Ordering a collective after its producer]), records it in the flight
  // recorder and hands its completion to the watchdog. `issue` makes the NCCL call.
  template <class Issue>
  WorkHandle enqueue(const char* op, DType dtype, int64_t count, bool host_blocking, Issue&& issue) {
    std::lock_guard lock(issue_mutex);
    watchdog->throw_if_failed();
    (void)cuda::current_device();  // a thread new to CUDA (a DDP comm thread) moves to our device
    const int64_t seq = next_seq++;
    // Recorded like MPI's collectives (comm/collective_log.h): started when issued to the GPU,
    // finished when its event completes; one the watchdog times out stays "started".
    const LoggedCollective record(log, op, dtype, count);
    // Watched from before the call: a first collective can block the host while NCCL connects.
    const int64_t key = watchdog->begin(seq, op);
    std::unique_ptr<DeviceSpan> span;  // null: not device-timed, no events
    record.started();
    try {
      if (device_timing) span = start_device_span();
      issue(comm_stream->handle());
      if (span) CUDA_CHECK(cudaEventRecord(span->end.get(), comm_stream->handle()));
    } catch (...) {
      watchdog->end(key);
      record.finished(false);
      throw;
    }
    std::shared_ptr<Event> done = comm_stream->record();
    auto finished = std::make_shared<std::atomic<int64_t>>(0);
    auto work = std::make_shared<NcclWork>(done, *compute, watchdog, host_blocking, finished);
    work->set_device_span(std::move(span));
    watchdog->set_done(key, std::move(done), [finished, record] {
      NcclWork::mark(*finished);
      record.finished(true);
    });
    return work;
  }

  // The timing events around one collective, its start recorded now (under issue_mutex).
  std::unique_ptr<DeviceSpan> start_device_span() {
    if (!anchor || steady_now_ns() - anchor->host_ns > kAnchorRenewalNs)
      anchor = make_clock_anchor(anchor_stream->handle());
    auto span = std::make_unique<DeviceSpan>();
    span->anchor = anchor;
    span->start = timing_event();
    span->end = timing_event();
    CUDA_CHECK(cudaEventRecord(span->start.get(), comm_stream->handle()));
    return span;
  }
};

NcclCommunicator::NcclCommunicator(Communicator& bootstrap, Device device, NcclOptions options)
    : impl_(std::make_unique<Impl>()) {
  DTRAIN_CHECK(device.is_cuda(), "the NCCL communicator needs a CUDA device, got {}", device.str());
  DTRAIN_CHECK(options.compute != nullptr && options.compute->device() == device,
               "the NCCL communicator needs the compute stream of {}", device.str());
  Impl& s = *impl_;
  s.rank = bootstrap.rank();
  s.size = bootstrap.size();
  s.local_rank = bootstrap.local_rank();
  s.local_size = bootstrap.local_size();
  s.device = device.index;
  cuda::set_device(device.index);
  s.compute = options.compute;
  s.log = options.log;
  s.comm_stream = std::make_unique<cuda::CudaStream>(device.index);
  s.device_timing = options.device_timing;
  if (s.device_timing) s.anchor_stream = std::make_unique<cuda::CudaStream>(device.index);
  s.watchdog = std::make_shared<NcclWatchdog>(s.rank, device.index, options.timeout, options.poll_interval,
                                              options.dump_log, options.dump_requests);

  // Rank 0 makes the id; the bootstrap communicator carries its bytes.
  ncclUniqueId id{};
  if (s.rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  bootstrap.broadcast(&id, static_cast<int64_t>(sizeof id), DType::kU8, 0);

  const int64_t key = s.watchdog->begin(0, "init");
  NCCL_CHECK(ncclCommInitRank(&s.comm, s.size, id, s.rank));
  s.watchdog->end(key);
  s.watchdog->attach(s.comm);

  s.barrier_buf = cuda::alloc(sizeof(float), device.index);
  cuda::zero(s.barrier_buf, sizeof(float));
}

NcclCommunicator::~NcclCommunicator() {
  Impl& s = *impl_;
  if (s.comm && std::uncaught_exceptions() > s.exceptions_at_construction) {
    // Unwinding from an error on this rank: the peers are not destroying with us
    // (ncclCommDestroy is collective within a node), and the process is on its way to
    // abort_all, which prints the real error and ends every rank. Waiting here would hide that
    // error behind a shut-down timeout, so the communicator is deliberately left to the exit.
    s.watchdog->detach();
    return;
  }
  if (s.comm) {
    // Shut-down is watched like a collective: a peer that died makes it hang, not fail.
    const int64_t key = s.watchdog->begin(0, "shutdown");
    (void)cudaStreamSynchronize(s.comm_stream->handle());
    s.watchdog->detach();
    (void)ncclCommDestroy(s.comm);  // destructor: nothing useful to do with an error here
    s.watchdog->end(key);
  }
  if (s.barrier_buf) {
    try {
      cuda::free(s.barrier_buf, sizeof(float), s.device);
    } catch (...) {
    }
  }
}

int NcclCommunicator::rank() const { return impl_->rank; }
int NcclCommunicator::size() const { return impl_->size; }
int NcclCommunicator::local_rank() const { return impl_->local_rank; }
int NcclCommunicator::local_size() const { return impl_->local_size; }
Stream& NcclCommunicator::stream() { return *impl_->comm_stream; }

WorkHandle NcclCommunicator::allreduce_async(void* buf, int64_t count, DType dtype, ReduceOp op) {
  (void)cuda::current_device();  // a thread that never chose a device adopts the process's
  check_device_buffer(buf, count, "allreduce", "the");
  const ncclDataType_t type = nccl_type(dtype);
  const ncclRedOp_t red = nccl_op(op);
  ncclComm_t comm = impl_->comm;
  return impl_->enqueue("allreduce", dtype, count, false, [&](cudaStream_t stream) {
    NCCL_CHECK(ncclAllReduce(buf, buf, static_cast<size_t>(count), type, red, comm, stream));
  });
}

WorkHandle NcclCommunicator::broadcast_async(void* buf, int64_t count, DType dtype, int root) {
  check_device_buffer(buf, count, "broadcast", "the");
  DTRAIN_CHECK(root >= 0 && root < impl_->size, "NCCL broadcast from root {} in a world of {}", root, impl_->size);
  const ncclDataType_t type = nccl_type(dtype);
  ncclComm_t comm = impl_->comm;
  return impl_->enqueue("broadcast", dtype, count, false, [&](cudaStream_t stream) {
    NCCL_CHECK(ncclBroadcast(buf, buf, static_cast<size_t>(count), type, root, comm, stream));
  });
}

WorkHandle NcclCommunicator::allgather_async(const void* send, void* recv, int64_t count_per_rank, DType dtype) {
  check_device_buffer(send, count_per_rank, "allgather", "send");
  check_device_buffer(recv, count_per_rank, "allgather", "receive");
  const ncclDataType_t type = nccl_type(dtype);
  ncclComm_t comm = impl_->comm;
  return impl_->enqueue("allgather", dtype, count_per_rank, false, [&](cudaStream_t stream) {
    NCCL_CHECK(ncclAllGather(send, recv, static_cast<size_t>(count_per_rank), type, comm, stream));
  });
}

WorkHandle NcclCommunicator::reduce_scatter_async(const void* send, void* recv, int64_t count_per_rank, DType dtype,
                                                  ReduceOp op) {
  check_device_buffer(send, count_per_rank, "reduce_scatter", "send");
  check_device_buffer(recv, count_per_rank, "reduce_scatter", "receive");
  const ncclDataType_t type = nccl_type(dtype);
  const ncclRedOp_t red = nccl_op(op);
  ncclComm_t comm = impl_->comm;
  return impl_->enqueue("reduce_scatter", dtype, count_per_rank, false, [&](cudaStream_t stream) {
    NCCL_CHECK(ncclReduceScatter(send, recv, static_cast<size_t>(count_per_rank), type, red, comm, stream));
  });
}

WorkHandle NcclCommunicator::barrier_async() {
  void* buf = impl_->barrier_buf;
  ncclComm_t comm = impl_->comm;
  return impl_->enqueue("barrier", DType::kF32, 1, true, [&](cudaStream_t stream) {
    NCCL_CHECK(ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, comm, stream));
  });
}

WorkHandle NcclCommunicator::batch_p2p_async(std::vector<P2pOp> ops) {
  (void)cuda::current_device();
  int64_t total = 0;
  bool sends = false, recvs = false;
  for (const P2pOp& op : ops) {
    DTRAIN_CHECK(op.peer >= 0 && op.peer < impl_->size, "NCCL {} with peer {} in a world of {}",
                 op.kind == P2pOp::kSend ? "send" : "recv", op.peer, impl_->size);
    check_device_buffer(op.buf, op.count, op.kind == P2pOp::kSend ? "send" : "recv", "the");
    total += op.count;
    (op.kind == P2pOp::kSend ? sends : recvs) = true;
  }
  const char* kind = sends && recvs ? "sendrecv" : sends ? "send" : "recv";  // an empty group is a no-op
  const DType dtype = ops.empty() ? DType::kF32 : ops.front().dtype;
  ncclComm_t comm = impl_->comm;
  return impl_->enqueue(kind, dtype, total, false, [&](cudaStream_t stream) {
    NCCL_CHECK(ncclGroupStart());
    for (const P2pOp& op : ops) {
      const ncclDataType_t type = nccl_type(op.dtype);
      if (op.kind == P2pOp::kSend)
        NCCL_CHECK(ncclSend(op.buf, static_cast<size_t>(op.count), type, op.peer, comm, stream));
      else
        NCCL_CHECK(ncclRecv(op.buf, static_cast<size_t>(op.count), type, op.peer, comm, stream));
    }
    NCCL_CHECK(ncclGroupEnd());
  });
}

}  // namespace dtrain
