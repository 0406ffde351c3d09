// MpiCommunicator: collectives as jobs on the communication thread.
#include "comm/mpi_communicator.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "comm/mpi_check.h"

namespace dtrain {

namespace {

// MPI counts are int; longer buffers are reduced/broadcast in chunks of this many elements.
constexpr int64_t kMaxChunk = INT_MAX;

// Each rank's slot in the shared all-reduce window; larger buffers go through it in blocks.
constexpr size_t kShmSlotBytes = size_t{4} << 20;

bool shm_allreduce_enabled() {
  const char* v = std::getenv("DTRAIN_SHM_ALLREDUCE");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

void check_count(int64_t count, const void* buf, const char* what) {
  DTRAIN_CHECK(count >= 0, "{}: negative count {}", what, count);
  DTRAIN_CHECK(count == 0 || buf != nullptr, "{}: null buffer for {} elements", what, count);
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm parent, bool shared_memory_allreduce) {
  MPI_CHECK(MPI_Comm_dup(parent, &comm_));
  MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  MPI_CHECK(MPI_Comm_rank(node, &local_rank_));
  MPI_CHECK(MPI_Comm_size(node, &local_size_));
  MPI_CHECK(MPI_Comm_free(&node));
  // Creating it is collective, so the ranks agree first: an environment variable set on only
  // some ranks must not leave the others waiting in a collective those never join.
  int use_shm = shared_memory_allreduce && size_ > 1 && local_size_ == size_ && shm_allreduce_enabled() ? 1 : 0;
  if (size_ > 1) MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &use_shm, 1, MPI_INT, MPI_MIN, comm_));
  if (use_shm) shm_ = ShmAllreduce::create(comm_, kShmSlotBytes);
  stream_ = make_stream(Device::cpu());
}

MpiCommunicator::~MpiCommunicator() = default;

WorkHandle MpiCommunicator::allreduce_async(void* buf, int64_t count, DType dtype, ReduceOp op) {
  check_count(count, buf, "allreduce");
  DTRAIN_CHECK(op != ReduceOp::kAvg || !is_integer(dtype), "allreduce: ReduceOp::kAvg needs a floating-point dtype, got {}",
               dtype_name(dtype));
  if (count == 0) return WorkQueue::completed();
  if (shm_ && ShmAllreduce::supports(dtype))
    return queue_.submit([this, buf, count, op] { shm_->allreduce(static_cast<float*>(buf), count, op); });
  MPI_Datatype type = mpi_datatype(dtype);
  MPI_Op sum = ops_.sum(dtype);
  return queue_.submit([this, buf, count, dtype, op, type, sum] {
    auto* p = static_cast<char*>(buf);
    const size_t esize = dtype_size(dtype);
    for (int64_t done = 0; done < count;) {
      int n = static_cast<int>(std::min(count - done, kMaxChunk));
      MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, p + done * esize, n, type, sum, comm_));
      done += n;
    }
    if (op == ReduceOp::kAvg) divide_in_place(buf, count, dtype, size_);
  });
}

Tensor MpiCommunicator::allocate_reduce_buffer(int64_t numel, DType dtype, Device device) {
  if (!shm_ || !ShmAllreduce::supports(dtype) || !device.is_cpu() || numel <= 0)
    return Communicator::allocate_reduce_buffer(numel, dtype, device);
  float* region = nullptr;
  queue_.submit([this, numel, &region] { region = shm_->allocate_region(numel); })->wait();
  if (region == nullptr) return Communicator::allocate_reduce_buffer(numel, dtype, device);
  return Tensor::from_external(region, {numel}, device, dtype);
}

std::string MpiCommunicator::describe() const {
  return shm_ ? "mpi (shared-memory all-reduce)" : "mpi";
}

WorkHandle MpiCommunicator::broadcast_async(void* buf, int64_t count, DType dtype, int root) {
  check_count(count, buf, "broadcast");
  DTRAIN_CHECK(root >= 0 && root < size_, "broadcast: root {} is not a rank of {}", root, size_);
  if (count == 0) return WorkQueue::completed();
  MPI_Datatype type = mpi_datatype(dtype);
  return queue_.submit([this, buf, count, dtype, root, type] {
    auto* p = static_cast<char*>(buf);
    const size_t esize = dtype_size(dtype);
    for (int64_t done = 0; done < count;) {
      int n = static_cast<int>(std::min(count - done, kMaxChunk));
      MPI_CHECK(MPI_Bcast(p + done * esize, n, type, root, comm_));
      done += n;
    }
  });
}

WorkHandle MpiCommunicator::allgather_async(const void* send, void* recv, int64_t count_per_rank, DType dtype) {
  check_count(count_per_rank, send, "allgather");
  check_count(count_per_rank, recv, "allgather");
  // MPI_Allgather's counts and displacements are int; a larger gather would need Allgatherv.
  DTRAIN_CHECK(count_per_rank * size_ <= kMaxChunk, "allgather: {} elements per rank x {} ranks exceeds MPI's int count",
               count_per_rank, size_);
  if (count_per_rank == 0) return WorkQueue::completed();
  MPI_Datatype type = mpi_datatype(dtype);
  const size_t block = static_cast<size_t>(count_per_rank) * dtype_size(dtype);
  // MPI forbids aliasing send and recv; the caller's own block is the in-place form.
  const void* own_block = static_cast<const char*>(recv) + static_cast<size_t>(rank_) * block;
  const void* sendbuf = send == own_block ? MPI_IN_PLACE : send;
  int n = static_cast<int>(count_per_rank);
  return queue_.submit(
      [this, sendbuf, recv, n, type] { MPI_CHECK(MPI_Allgather(sendbuf, n, type, recv, n, type, comm_)); });
}

WorkHandle MpiCommunicator::barrier_async() {
  return queue_.submit([this] { MPI_CHECK(MPI_Barrier(comm_)); });
}

void MpiCommunicator::shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  queue_.drain_and_stop();
  ops_.release();
  if (shm_) shm_->release();
  MPI_CHECK(MPI_Comm_free(&comm_));
}

}  // namespace dtrain
