// MpiCommunicator: collectives as jobs on the communication thread.
#include "comm/mpi_communicator.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "comm/collective_check.h"
#include "comm/p2p.h"
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

MpiCommunicator::MpiCommunicator(MPI_Comm parent, const CollectiveOptions& options)
    : options_(options), recorder_(options.flight_recorder_size, options.name) {
  MPI_CHECK(MPI_Comm_dup(parent, &comm_));
  MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
  {
    // Messages and dump files name world ranks, whichever communicator this is.
    MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    MPI_CHECK(MPI_Comm_group(comm_, &mine));
    MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
    std::vector<int> ranks(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) ranks[static_cast<size_t>(r)] = r;
    world_ranks_.resize(ranks.size());
    MPI_CHECK(MPI_Group_translate_ranks(mine, size_, ranks.data(), world, world_ranks_.data()));
    MPI_CHECK(MPI_Group_free(&mine));
    MPI_CHECK(MPI_Group_free(&world));
  }
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  MPI_CHECK(MPI_Comm_rank(node, &local_rank_));
  MPI_CHECK(MPI_Comm_size(node, &local_size_));
  MPI_CHECK(MPI_Comm_free(&node));
  // Creating it is collective, so the ranks agree first: an environment variable set on only
  // some ranks must not leave the others waiting in a collective those never join.
  // The same for the watchdog's board and the header checks: on for all if any rank wants them.
  int agreed[3] = {options.shared_memory_allreduce && size_ > 1 && local_size_ == size_ && shm_allreduce_enabled() ? 0 : 1,
                   options.timeout_s > 0 || options.flight_recorder_size > 0 ? 1 : 0,
                   options.check_every_collective ? 1 : 0};
  if (size_ > 1) MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, agreed, 3, MPI_INT, MPI_MAX, comm_));
  const bool use_shm = size_ > 1 && agreed[0] == 0;
  const bool watched = agreed[1] != 0;
  check_headers_ = size_ > 1 && agreed[2] != 0;
  if (use_shm) shm_ = ShmAllreduce::create(comm_, kShmSlotBytes);
  if (size_ > 1 && watched) board_ = ProgressBoard::create(comm_);
  stream_ = make_stream(Device::cpu());
  if (watched) {
    int world_size = size_;
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
    watchdog_ = std::make_unique<CollectiveWatchdog>(WatchdogSettings{options.timeout_s, options.flight_recorder_dir},
                                                     world_ranks_[static_cast<size_t>(rank_)], world_size, recorder_,
                                                     board_.get());
  }
}

void MpiCommunicator::claim_mode(bool p2p) {
  const int want = p2p ? 2 : 1;
  int mode = 0;
  if (mode_.compare_exchange_strong(mode, want) || mode == want) return;
  throw Error(fmt::format("{}: {} on a communicator that already runs {}: split() a communicator of its own for "
                          "point-to-point (Note [Point-to-point])",
                          options_.name, p2p ? "point-to-point send/recv" : "a collective",
                          p2p ? "collectives" : "point-to-point send/recv"));
}

WorkHandle MpiCommunicator::submit(const char* kind, DType dtype, int64_t count, std::function<void(int64_t)> body,
                                   bool p2p) {
  claim_mode(p2p);
  if (!watchdog_) {
    const int64_t seq = unrecorded_seq_.fetch_add(1, std::memory_order_relaxed) + 1;
    return queue_.submit([seq, body = std::move(body)] { body(seq); });
  }
  // Recorded like the NCCL communicator's collectives (comm/collective_log.h).
  const LoggedCollective record(&recorder_, kind, dtype, count);
  const int64_t seq = record.seq();
  const int code = ProgressBoard::kind_code(kind);
  const bool on_board = board_ && !p2p;
  return queue_.submit([this, record, seq, code, dtype, count, on_board, body = std::move(body)] {
    record.started();
    if (on_board) board_->started(seq, code, count, dtype);
    watchdog_->begin(seq);
    try {
      body(seq);
    } catch (const std::exception& e) {
      watchdog_->end();
      record.finished(false);
      // MPI may fail a collective whose ranks disagree (MPI_ERR_TRUNCATE: another count): the
      // board says how, when they are on this node (Note [Checking every collective]).
      const std::string differs = on_board ? mismatch_behind(e.what()) : "";
      watchdog_->dump(fmt::format("collective #{} failed: {}", seq, differs.empty() ? e.what() : differs));
      if (!differs.empty()) throw Error(differs);
      throw;
    }
    watchdog_->end();
    record.finished(true);
    if (on_board) board_->completed(seq);
  });
}

std::string MpiCommunicator::mismatch_behind(const std::string& error) const {
  if (!board_ || error.find("ranks issued different collectives") != std::string::npos) return "";
  const std::string differs = different_collective_text(board_->read(), board_->local_rank());
  return differs.empty() ? "" : fmt::format("{} (MPI: {})", differs, error);
}

void MpiCommunicator::check_same_collective(int64_t seq, const char* kind, int64_t count) const {
  if (!board_) return;
  const std::vector<ProgressBoard::Entry> board = board_->read();
  // Every rank has arrived: all are in collective `seq` unless one skipped or repeated one.
  if (std::string differs = different_collective_text(board, board_->local_rank()); !differs.empty()) throw Error(differs);
  const std::string differs = not_arrived_text(board, board_->local_rank(), seq,
                                               ProgressBoard::kind_code(kind), count,
                                               static_cast<int>(DType::kF32));
  if (!differs.empty())
    throw Error(fmt::format("ranks issued different collectives: rank {} is in #{}: {} of {} float32; {}", rank_,
                            seq, kind, count, differs));
}

void MpiCommunicator::check_header(int64_t seq, const char* kind, int64_t count, DType dtype) {
  if (!check_headers_) return;
  const CollectiveHeader mine{seq, ProgressBoard::kind_code(kind), count, static_cast<int>(dtype)};
  int64_t reduced[8];
  pack_header_check(mine, reduced);
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, reduced, 8, MPI_INT64_T, MPI_MAX, comm_));
  if (header_check_agrees(reduced)) return;
  // Only on the way to an error: every rank's header, to name who differs and how.
  const int64_t packed[4] = {mine.seq, mine.kind, mine.count, mine.dtype};
  std::vector<int64_t> all(static_cast<size_t>(size_) * 4);
  MPI_CHECK(MPI_Allgather(packed, 4, MPI_INT64_T, all.data(), 4, MPI_INT64_T, comm_));
  std::vector<CollectiveHeader> headers;
  for (int r = 0; r < size_; ++r) {
    const int64_t* h = &all[static_cast<size_t>(r) * 4];
    headers.push_back({h[0], static_cast<int>(h[1]), h[2], static_cast<int>(h[3])});
  }
  throw Error(header_mismatch_text(headers));
}

MpiCommunicator::~MpiCommunicator() = default;

WorkHandle MpiCommunicator::allreduce_async(void* buf, int64_t count, DType dtype, ReduceOp op) {
  check_count(count, buf, "allreduce");
  DTRAIN_CHECK(op != ReduceOp::kAvg || !is_integer(dtype), "allreduce: ReduceOp::kAvg needs a floating-point dtype, got {}",
               dtype_name(dtype));
  if (count == 0) return WorkQueue::completed();
  if (shm_ && ShmAllreduce::supports(dtype)) {
    return submit("allreduce", dtype, count, [this, buf, count, op](int64_t seq) {
      shm_->allreduce(static_cast<float*>(buf), count, op,
                      [this, seq, count] { check_same_collective(seq, "allreduce", count); });
    });
  }
  MPI_Datatype type = mpi_datatype(dtype);
  MPI_Op sum = ops_.sum(dtype);
  return submit("allreduce", dtype, count, [this, buf, count, dtype, op, type, sum](int64_t seq) {
    check_header(seq, "allreduce", count, dtype);
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
  return submit("broadcast", dtype, count, [this, buf, count, dtype, root, type](int64_t seq) {
    check_header(seq, "broadcast", count, dtype);
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
  if (shm_ && ShmAllreduce::supports(dtype)) {
    return submit("allgather", dtype, count_per_rank, [this, send, recv, count_per_rank](int64_t seq) {
      shm_->allgather(static_cast<const float*>(send), static_cast<float*>(recv), count_per_rank,
                      [this, seq, count_per_rank] { check_same_collective(seq, "allgather", count_per_rank); });
    });
  }
  MPI_Datatype type = mpi_datatype(dtype);
  const size_t block = static_cast<size_t>(count_per_rank) * dtype_size(dtype);
  // MPI forbids aliasing send and recv; the caller's own block is the in-place form.
  const void* own_block = static_cast<const char*>(recv) + static_cast<size_t>(rank_) * block;
  const void* sendbuf = send == own_block ? MPI_IN_PLACE : send;
  int n = static_cast<int>(count_per_rank);
  return submit("allgather", dtype, count_per_rank,
                [this, sendbuf, recv, n, type, count_per_rank, dtype](int64_t seq) {
                  check_header(seq, "allgather", count_per_rank, dtype);
                  MPI_CHECK(MPI_Allgather(sendbuf, n, type, recv, n, type, comm_));
                });
}

WorkHandle MpiCommunicator::reduce_scatter_async(const void* send, void* recv, int64_t count_per_rank, DType dtype,
                                                  ReduceOp op) {
  check_count(count_per_rank, send, "reduce_scatter");
  check_count(count_per_rank, recv, "reduce_scatter");
  DTRAIN_CHECK(op != ReduceOp::kAvg || !is_integer(dtype),
               "reduce_scatter: ReduceOp::kAvg needs a floating-point dtype, got {}", dtype_name(dtype));
  // MPI_Reduce_scatter_block's count is int, and Open MPI sizes its scratch by the whole buffer.
  DTRAIN_CHECK(count_per_rank * size_ <= kMaxChunk,
               "reduce_scatter: {} elements per rank x {} ranks exceeds MPI's int count", count_per_rank, size_);
  if (count_per_rank == 0) return WorkQueue::completed();
  const size_t block = static_cast<size_t>(count_per_rank) * dtype_size(dtype);
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  // In place by NCCL's rule (recv is this rank's block of send); any other overlap is an error.
  const bool in_place = out == in + static_cast<size_t>(rank_) * block;
  const auto in_at = reinterpret_cast<uintptr_t>(in), out_at = reinterpret_cast<uintptr_t>(out);
  DTRAIN_CHECK(in_place || out_at + block <= in_at || out_at >= in_at + static_cast<size_t>(size_) * block,
               "reduce_scatter: the receive buffer overlaps the send buffer but is not rank {}'s block of it", rank_);
  if (shm_ && ShmAllreduce::supports(dtype)) {
    return submit("reduce_scatter", dtype, count_per_rank, [this, in, out, count_per_rank, op](int64_t seq) {
      shm_->reduce_scatter(reinterpret_cast<const float*>(in), reinterpret_cast<float*>(out), count_per_rank, op,
                           [this, seq, count_per_rank] { check_same_collective(seq, "reduce_scatter", count_per_rank); });
    });
  }
  MPI_Datatype type = mpi_datatype(dtype);
  MPI_Op sum = ops_.sum(dtype);
  return submit("reduce_scatter", dtype, count_per_rank,
                [this, in, out, in_place, block, count_per_rank, dtype, op, type, sum](int64_t seq) {
                  check_header(seq, "reduce_scatter", count_per_rank, dtype);
                  const int n = static_cast<int>(count_per_rank);
                  if (in_place) {
                    // MPI's in-place form reads the whole buffer and leaves the result at its start.
                    char* whole = const_cast<char*>(in);
                    MPI_CHECK(MPI_Reduce_scatter_block(MPI_IN_PLACE, whole, n, type, sum, comm_));
                    if (whole != out) std::memmove(out, whole, block);
                  } else {
                    MPI_CHECK(MPI_Reduce_scatter_block(in, out, n, type, sum, comm_));
                  }
                  if (op == ReduceOp::kAvg) divide_in_place(out, count_per_rank, dtype, size_);
                });
}

WorkHandle MpiCommunicator::batch_p2p_async(std::vector<P2pOp> ops) {
  check_p2p_batch(ops, size_, kMaxChunk);
  if (ops.empty()) return WorkQueue::completed();
  int64_t total = 0;
  for (const P2pOp& op : ops) total += op.count;
  // The label names the peers (world ranks), after what the caller said the batch is for.
  const std::string peers = p2p_text(ops, world_ranks_);
  const std::string caller = collective_detail();
  const ScopedCollectiveDetail detail(caller.empty() ? peers : caller + ": " + peers);
  const char* kind = p2p_kind(ops);  // before ops moves into the job
  const DType dtype = ops.front().dtype;
  return submit(kind, dtype, total, [this, ops = std::move(ops)](int64_t) { run_p2p(ops); }, /*p2p=*/true);
}

void MpiCommunicator::run_p2p(const std::vector<P2pOp>& ops) {
  // Note [Point-to-point headers]: every send is preceded by its header (kind, count, dtype,
  // tag; 32 bytes), and a batch posts its receives' data only once their headers arrived and
  // agree. A receive of another count or dtype is then one line naming both sides, never MPI
  // truncating a message (Open MPI 4 left such a receive waiting forever when the message came
  // in before it was posted). It waits for nothing the batch did not wait for already: the
  // sends, data included, are all posted first.
  const int header_tag = kMaxP2pTag + 1;
  auto peer_world = [this](const P2pOp& op) { return world_ranks_[static_cast<size_t>(op.peer)]; };
  std::vector<int64_t> headers(ops.size() * 4);
  std::vector<MPI_Request> sends, header_recvs;
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2pOp& op = ops[i];
    MPI_Request r = MPI_REQUEST_NULL;
    if (op.kind == P2pOp::kSend) {
      pack_p2p_header(op, &headers[i * 4]);
      MPI_CHECK(MPI_Isend(&headers[i * 4], 4, MPI_INT64_T, op.peer, header_tag + op.tag, comm_, &r));
      sends.push_back(r);
      MPI_CHECK(MPI_Isend(op.buf, static_cast<int>(op.count), mpi_datatype(op.dtype), op.peer, op.tag, comm_, &r));
      sends.push_back(r);
    } else {
      MPI_CHECK(MPI_Irecv(&headers[i * 4], 4, MPI_INT64_T, op.peer, header_tag + op.tag, comm_, &r));
      header_recvs.push_back(r);
    }
  }
  MPI_CHECK(MPI_Waitall(static_cast<int>(header_recvs.size()), header_recvs.data(), MPI_STATUSES_IGNORE));
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].kind != P2pOp::kRecv) continue;
    if (std::string differs = p2p_header_mismatch(ops[i], &headers[i * 4], peer_world(ops[i])); !differs.empty()) {
      // This batch's sends may still be reading their headers, and the error ends the job (the
      // peer's data send will never be received): the headers are left to the process's end
      // rather than freed under a pending MPI_Isend.
      static std::mutex kept_mutex;
      static std::vector<std::vector<int64_t>> kept;  // reachable: not a leak to LeakSanitizer
      {
        std::lock_guard lock(kept_mutex);
        kept.push_back(std::move(headers));  // a move keeps the buffer where the sends read it
      }
      throw Error(differs);
    }
  }
  std::vector<MPI_Request> recvs;
  std::vector<size_t> recv_op;
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2pOp& op = ops[i];
    if (op.kind != P2pOp::kRecv) continue;
    MPI_Request r = MPI_REQUEST_NULL;
    MPI_CHECK(MPI_Irecv(op.buf, static_cast<int>(op.count), mpi_datatype(op.dtype), op.peer, op.tag, comm_, &r));
    recvs.push_back(r);
    recv_op.push_back(i);
  }
  std::vector<MPI_Status> statuses(recvs.size());
  MPI_CHECK(MPI_Waitall(static_cast<int>(recvs.size()), recvs.data(), statuses.data()));
  MPI_CHECK(MPI_Waitall(static_cast<int>(sends.size()), sends.data(), MPI_STATUSES_IGNORE));
  for (size_t k = 0; k < recvs.size(); ++k) {
    // What the header promised is what came (a backstop: both come from the same send).
    const P2pOp& op = ops[recv_op[k]];
    int got = 0;
    MPI_CHECK(MPI_Get_count(&statuses[k], mpi_datatype(op.dtype), &got));
    if (std::string differs = p2p_count_mismatch(op, got == MPI_UNDEFINED ? -1 : got, peer_world(op)); !differs.empty())
      throw Error(differs);
  }
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key, const std::string& name) {
  DTRAIN_CHECK(color >= 0, "split: color {} is negative", color);
  // The child's communication thread runs MPI beside this one's (Note [Sub-communicators]).
  int provided = MPI_THREAD_SINGLE;
  MPI_CHECK(MPI_Query_thread(&provided));
  if (provided < MPI_THREAD_MULTIPLE)
    throw Error("split: sub-communicators need MPI started with MPI_THREAD_MULTIPLE "
                "(RuntimeOptions::concurrent_communicators)");
  MPI_Comm part = MPI_COMM_NULL;
  // On the communication thread, in order with the collectives (every rank calls split alike).
  submit("barrier", DType::kU8, 0, [this, color, key, &part](int64_t) {
    MPI_CHECK(MPI_Comm_split(comm_, color, key, &part));
  })->wait();
  CollectiveOptions options = options_;
  options.name = name;
  // The child duplicates `part` (its constructor runs MPI on this thread: Note [Sub-communicators]).
  auto child = std::make_unique<MpiCommunicator>(part, options);
  MPI_CHECK(MPI_Comm_free(&part));
  return child;
}

WorkHandle MpiCommunicator::barrier_async() {
  return submit("barrier", DType::kU8, 0, [this](int64_t seq) {
    check_header(seq, "barrier", 0, DType::kU8);
    MPI_CHECK(MPI_Barrier(comm_));
  });
}

void MpiCommunicator::shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  queue_.drain_and_stop();
  watchdog_.reset();
  ops_.release();
  if (shm_) shm_->release();
  if (board_) board_->release();
  MPI_CHECK(MPI_Comm_free(&comm_));
}

}  // namespace dtrain
