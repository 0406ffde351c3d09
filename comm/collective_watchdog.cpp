// ProgressBoard and CollectiveWatchdog (see collective_watchdog.h).
#include "comm/collective_watchdog.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iterator>
#include <new>

#include <fmt/format.h>

#include "comm/collective_check.h"
#include "comm/communicator.h"
#include "comm/mpi_check.h"
#include "comm/watchdog_policy.h"
#include "core/poison.h"
#include "core/temp_files.h"

namespace dtrain {

// `version` is odd while started() rewrites the slot: a reader that sees it change retries, so it
// never pairs one collective's sequence number with the next one's kind or count.
struct ProgressBoard::Slot {
  std::atomic<int64_t> version{0};
  std::atomic<int64_t> started{0}, completed{0}, count{0};
  std::atomic<int32_t> kind{0}, dtype{0};
  std::atomic<int64_t> heartbeat_ns{0};
};
static_assert(std::atomic<int64_t>::is_always_lock_free, "the board is shared between processes");

namespace {
constexpr const char* kKindNames[] = {"?", "allreduce", "broadcast", "allgather", "barrier", "reduce_scatter"};
constexpr int kKinds = static_cast<int>(std::size(kKindNames));
}  // namespace

// Note [Stopped ranks beyond this communicator]: a pipeline rank waits on a stage replica that
// itself waits on a stopped neighbour in another communicator; the first deadline to pass may be
// the one whose board shows only the live replica. Every board of this process is listed here, so
// its timeout line also names the ranks of the node that beat on none of them (a live process
// beats on every board it holds; one that left a communicator early still beats on the others).
namespace {
std::mutex& boards_mutex() {
  static std::mutex m;
  return m;
}
std::vector<const ProgressBoard*>& process_boards() {
  static std::vector<const ProgressBoard*> boards;
  return boards;
}
void forget_board(const ProgressBoard* b) {
  std::lock_guard lock(boards_mutex());
  std::erase(process_boards(), b);
}
}  // namespace

int ProgressBoard::kind_code(const std::string& kind) {
  for (int i = 1; i < kKinds; ++i)
    if (kind == kKindNames[i]) return i;
  return 0;
}

const char* ProgressBoard::kind_name(int code) { return code > 0 && code < kKinds ? kKindNames[code] : "?"; }

std::unique_ptr<ProgressBoard> ProgressBoard::create(MPI_Comm world) {
  std::unique_ptr<ProgressBoard> b(new ProgressBoard);
  int rank = 0, world_rank = 0, local_size = 1;
  MPI_CHECK(MPI_Comm_rank(world, &rank));
  // The board names ranks as every line does, by MPI_COMM_WORLD's numbers: on a sub-communicator
  // (a pipeline's stage or chain) its own rank would name another process.
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &b->node_));
  MPI_CHECK(MPI_Comm_set_errhandler(b->node_, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(b->node_, &b->local_rank_));
  MPI_CHECK(MPI_Comm_size(b->node_, &local_size));
  void* mine = nullptr;
  const int rc = MPI_Win_allocate_shared(sizeof(Slot), 1, MPI_INFO_NULL, b->node_, &mine, &b->win_);
  int ok = rc == MPI_SUCCESS ? 1 : 0;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, b->node_));
  if (!ok) {
    if (b->win_ != MPI_WIN_NULL) MPI_Win_free(&b->win_);
    MPI_Comm_free(&b->node_);
    return nullptr;
  }
  new (mine) Slot();
  b->world_ranks_.assign(static_cast<size_t>(local_size), 0);
  MPI_CHECK(MPI_Allgather(&world_rank, 1, MPI_INT, b->world_ranks_.data(), 1, MPI_INT, b->node_));
  for (int r = 0; r < local_size; ++r) {
    MPI_Aint bytes = 0;
    int unit = 0;
    void* base = nullptr;
    MPI_CHECK(MPI_Win_shared_query(b->win_, r, &bytes, &unit, &base));
    b->slots_.push_back(static_cast<Slot*>(base));
  }
  MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, b->win_));
  MPI_CHECK(MPI_Barrier(b->node_));  // every slot is constructed before anyone reads one
  {
    std::lock_guard lock(boards_mutex());
    process_boards().push_back(b.get());
  }
  return b;
}

ProgressBoard::~ProgressBoard() { forget_board(this); }

void ProgressBoard::started(int64_t seq, int kind, int64_t count, DType dtype) {
  Slot* s = slots_[static_cast<size_t>(local_rank_)];
  const int64_t v = s->version.load(std::memory_order_relaxed);
  s->version.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  s->kind.store(kind, std::memory_order_relaxed);
  s->count.store(count, std::memory_order_relaxed);
  s->dtype.store(static_cast<int32_t>(dtype), std::memory_order_relaxed);
  s->started.store(seq, std::memory_order_relaxed);
  s->version.store(v + 2, std::memory_order_release);
}

void ProgressBoard::completed(int64_t seq) {
  slots_[static_cast<size_t>(local_rank_)]->completed.store(seq, std::memory_order_release);
}

void ProgressBoard::heartbeat(int64_t now_ns) {
  slots_[static_cast<size_t>(local_rank_)]->heartbeat_ns.store(now_ns, std::memory_order_relaxed);
}

std::vector<ProgressBoard::Entry> ProgressBoard::read() const {
  std::vector<Entry> out;
  for (size_t r = 0; r < slots_.size(); ++r) {
    const Slot* s = slots_[r];
    Entry e;
    e.world_rank = world_ranks_[r];
    // A stopped writer may be stopped mid-update: after a few tries, take what is there.
    for (int attempt = 0; attempt < 100; ++attempt) {
      const int64_t v = s->version.load(std::memory_order_acquire);
      e.started = s->started.load(std::memory_order_relaxed);
      e.kind = s->kind.load(std::memory_order_relaxed);
      e.count = s->count.load(std::memory_order_relaxed);
      e.dtype = s->dtype.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (v % 2 == 0 && s->version.load(std::memory_order_relaxed) == v) break;
    }
    e.completed = s->completed.load(std::memory_order_acquire);
    e.heartbeat_ns = s->heartbeat_ns.load(std::memory_order_relaxed);
    out.push_back(e);
  }
  return out;
}

void ProgressBoard::release() {
  forget_board(this);
  if (win_ != MPI_WIN_NULL) {
    MPI_CHECK(MPI_Win_unlock_all(win_));
    MPI_CHECK(MPI_Win_free(&win_));
  }
  if (node_ != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(&node_));
  slots_.clear();
}

namespace {

// Whether `e`'s watchdog stopped beating (`now_ns` 0: not judged), and the words for it.
bool is_stale(const ProgressBoard::Entry& e, int64_t now_ns) {
  return now_ns != 0 && e.heartbeat_ns != 0 && now_ns - e.heartbeat_ns > kHeartbeatStaleNs;
}
std::string not_responding(const ProgressBoard::Entry& e, int64_t now_ns) {
  // A communicator of transfers alone has no collective number on the board (#0).
  return fmt::format("rank {} is not responding (stopped or frozen: no heartbeat for {:.1f} s{})", e.world_rank,
                     static_cast<double>(now_ns - e.heartbeat_ns) * 1e-9,
                     e.started > 0 ? fmt::format("; it was in #{}", e.started) : "");
}

}  // namespace

std::vector<int> unresponsive_ranks(const std::vector<ProgressBoard::Entry>& board, int my_local_rank, int64_t now_ns) {
  std::vector<int> out;
  for (size_t r = 0; r < board.size(); ++r) {
    const ProgressBoard::Entry& e = board[r];
    if (static_cast<int>(r) != my_local_rank && is_stale(e, now_ns)) out.push_back(e.world_rank);
  }
  return out;
}

std::string unresponsive_text(const std::vector<ProgressBoard::Entry>& board, int my_local_rank, int64_t now_ns) {
  std::string out;
  for (size_t r = 0; r < board.size(); ++r)
    if (static_cast<int>(r) != my_local_rank && is_stale(board[r], now_ns))
      out += (out.empty() ? "" : "; ") + not_responding(board[r], now_ns);
  return out;
}

std::vector<ProgressBoard::Entry> freshest_entries(const std::vector<std::vector<ProgressBoard::Entry>>& boards) {
  std::vector<ProgressBoard::Entry> out;
  for (const auto& board : boards)
    for (const ProgressBoard::Entry& e : board) {
      auto it = std::find_if(out.begin(), out.end(), [&](const auto& o) { return o.world_rank == e.world_rank; });
      if (it == out.end())
        out.push_back(e);
      else if (e.heartbeat_ns > it->heartbeat_ns)
        *it = e;
    }
  return out;
}

std::string not_arrived_text(const std::vector<ProgressBoard::Entry>& board, int my_local_rank, int64_t seq, int kind,
                             int64_t count, int dtype, int64_t now_ns) {
  std::string out;
  for (size_t r = 0; r < board.size(); ++r) {
    if (static_cast<int>(r) == my_local_rank) continue;
    const ProgressBoard::Entry& e = board[r];
    std::string what;
    // A stopped or frozen process is the cause whatever collective it was in.
    if (is_stale(e, now_ns)) {
      what = not_responding(e, now_ns);
    } else if (e.started < seq) {
      what = fmt::format("rank {} has not arrived (last started #{}, completed #{})", e.world_rank, e.started,
                         e.completed);
    } else if (e.started > seq) {
      what = fmt::format("rank {} is ahead, in collective #{}: {} of {} {}", e.world_rank, e.started,
                         ProgressBoard::kind_name(e.kind), e.count, dtype_name(static_cast<DType>(e.dtype)));
    } else if (e.kind != kind || e.count != count || e.dtype != dtype) {
      what = fmt::format("rank {} is in a different collective #{}: {} of {} {}", e.world_rank, seq,
                         ProgressBoard::kind_name(e.kind), e.count, dtype_name(static_cast<DType>(e.dtype)));
    }
    if (!what.empty()) out += (out.empty() ? "" : "; ") + what;
  }
  return out;
}

std::string different_collective_text(const std::vector<ProgressBoard::Entry>& board, int my_local_rank) {
  const ProgressBoard::Entry& me = board[static_cast<size_t>(my_local_rank)];
  std::vector<CollectiveHeader> headers;
  bool differs = false;
  for (const ProgressBoard::Entry& e : board) {
    // Only ranks in the same collective number can be compared: one behind may yet arrive.
    if (e.started != me.started) continue;
    headers.push_back({e.started, e.kind, e.count, e.dtype});
    differs = differs || !(headers.back() == headers.front());
  }
  if (!differs) return "";
  std::string out = fmt::format("ranks issued different collectives at #{}:", me.started);
  for (const ProgressBoard::Entry& e : board)
    if (e.started == me.started)
      out += fmt::format(" rank {}: {} of {} {};", e.world_rank, ProgressBoard::kind_name(e.kind), e.count,
                         dtype_name(static_cast<DType>(e.dtype)));
  out.pop_back();
  return out;
}

constexpr const char* kPeerNotPosted =
    "a peer named in it has not posted the matching send or recv (its own line or `dtrain flight-report` says "
    "where it is)";

TimeoutExplanation explain_timeout(std::vector<ProgressBoard::Entry> board, int my_local_rank,
                                   const std::vector<ProgressBoard::Entry>& node, bool p2p, int64_t seq, int kind,
                                   int64_t count, int dtype, int64_t now_ns) {
  // Note [Stopped ranks beyond this communicator]: every rank judged by its newest heartbeat on
  // any board of this process, this communicator's members included.
  for (ProgressBoard::Entry& e : board)
    for (const ProgressBoard::Entry& n : node)
      if (n.world_rank == e.world_rank) e.heartbeat_ns = std::max(e.heartbeat_ns, n.heartbeat_ns);
  TimeoutExplanation out;
  if (p2p) {
    // Point-to-point is not on the board (Note [Point-to-point]): the label names the peers; the
    // heartbeats are, so a stopped peer is named as in a collective's line.
    out.others = kPeerNotPosted;
    if (std::string stale = unresponsive_text(board, my_local_rank, now_ns); !stale.empty())
      out.others = stale + "; " + kPeerNotPosted;
  } else {
    out.others = not_arrived_text(board, my_local_rank, seq, kind, count, dtype, now_ns);
    if (out.others.empty()) out.others = "every rank on this node arrived; the missing rank is on another node";
  }
  out.suspects = unresponsive_ranks(board, my_local_rank, now_ns);
  const int me = board[static_cast<size_t>(my_local_rank)].world_rank;
  for (ProgressBoard::Entry e : node) {
    const bool here = std::any_of(board.begin(), board.end(), [&](const auto& b) { return b.world_rank == e.world_rank; });
    if (e.world_rank == me || here || !is_stale(e, now_ns)) continue;
    out.suspects.push_back(e.world_rank);
    e.started = 0;  // its collective number is another communicator's
    out.others += fmt::format("; beyond this communicator, {}", not_responding(e, now_ns));
  }
  return out;
}

CollectiveWatchdog::CollectiveWatchdog(WatchdogSettings settings, int rank, int size, FlightRecorder& recorder,
                                       ProgressBoard* board)
    : settings_(std::move(settings)), rank_(rank), size_(size), recorder_(recorder), board_(board) {
  usr1_ = DumpOnRequest(rank_, "", &flight_recorder_dump_requests,
                        [this](const std::string& reason) { return dump(reason); });
  // What a rank killed in the middle of a dump left (the next dump would remove it too).
  remove_stale_temporaries(FlightRecorder::dump_path(settings_.dump_dir, rank_));
  thread_ = std::thread([this] { run(); });
  pthread_setname_np(thread_.native_handle(), "dtrain-watchdog");
}

CollectiveWatchdog::~CollectiveWatchdog() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

int64_t CollectiveWatchdog::steady_now_ns_relaxed() { return steady_now_ns(); }

std::string CollectiveWatchdog::dump(const std::string& reason, const std::vector<int>& unresponsive) {
  std::string error;
  const std::string path = recorder_.dump(settings_.dump_dir, rank_, size_, reason, unresponsive, error);
  return path.empty() ? fmt::format("not written: {}", error) : path;
}

void CollectiveWatchdog::run() {
  std::unique_lock lock(mu_);
  if (board_) board_->heartbeat(steady_now_ns());
  while (!cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stopping_; })) {
    if (board_) board_->heartbeat(steady_now_ns());
    usr1_.poll();
    const int64_t seq = running_seq_.load(std::memory_order_acquire);
    if (seq == 0) continue;
    if (board_ && steady_now_ns() - running_since_ns_.load(std::memory_order_relaxed) > kMismatchCheckAfterNs) {
      // Note [Checking every collective]: a slow collective may be one other ranks never issue.
      const std::vector<ProgressBoard::Entry> board = board_->read();
      const std::string differs = different_collective_text(board, board_->local_rank());
      if (!differs.empty() && board[static_cast<size_t>(board_->local_rank())].started == seq &&
          running_seq_.load(std::memory_order_acquire) == seq)
        fail_now(seq, differs);
    }
    if (settings_.timeout_s <= 0) continue;
    const auto since = WatchdogClock::time_point(std::chrono::nanoseconds(running_since_ns_.load(std::memory_order_relaxed)));
    const WatchdogPending pending[] = {{seq, "", since}};
    const auto timeout = std::chrono::duration_cast<WatchdogClock::duration>(std::chrono::duration<double>(settings_.timeout_s));
    const WatchdogVerdict v = watchdog_decide(pending, WatchdogClock::now(), timeout, "");
    if (v.action == WatchdogAction::kTimeout && running_seq_.load(std::memory_order_acquire) == seq)
      time_out(seq, v.waited_s);
  }
}

void CollectiveWatchdog::fail_now(int64_t seq, const std::string& differs) {
  // First: no save of this process may become visible from here on (core/poison.h).
  poison_process(fmt::format("collective #{}: {}", seq, differs));
  const std::string where = dump(fmt::format("collective #{}: {}", seq, differs));
  const std::string line = fmt::format("dtrain: rank {}: {}; flight recorder: {}\n", rank_, differs, where);
  std::fflush(stdout);
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
  std::_Exit(1);  // as time_out: the communication thread is inside MPI
}

void CollectiveWatchdog::time_out(int64_t seq, double waited_s) {
  // First, as fail_now: a background save in flight is not committed after this.
  poison_process(fmt::format("collective #{} timed out after {:.1f} s", seq, waited_s));
  CollectiveRecord rec;
  for (const CollectiveRecord& r : recorder_.snapshot())
    if (r.seq == seq) rec = r;
  const bool p2p = rec.kind == "send" || rec.kind == "recv" || rec.kind == "sendrecv";
  TimeoutExplanation why;
  if (board_) {
    // Note [Stopped ranks beyond this communicator]
    std::vector<std::vector<ProgressBoard::Entry>> boards;
    {
      std::lock_guard lock(boards_mutex());
      for (const ProgressBoard* b : process_boards()) boards.push_back(b->read());
    }
    why = explain_timeout(board_->read(), board_->local_rank(), freshest_entries(boards), p2p, seq,
                          ProgressBoard::kind_code(rec.kind), rec.count, static_cast<int>(rec.dtype), steady_now_ns());
  } else {
    why.others = p2p ? kPeerNotPosted
                     : "ranks on other nodes: see their lines or `dtrain flight-report`";
  }
  const std::string& others = why.others;
  const std::vector<int>& suspects = why.suspects;
  const std::string where = dump(fmt::format("timeout in collective #{}: {}", seq, others), suspects);
  const std::string line = fmt::format(
      "dtrain: rank {}: collective #{} ({} of {} {}{}) timed out after {:.1f} s (timeout {} s): {}; flight "
      "recorder: {}\n",
      rank_, seq, rec.kind, rec.count, dtype_name(rec.dtype), rec.label.empty() ? "" : ", " + rec.label, waited_s,
      settings_.timeout_s, others, where);
  std::fflush(stdout);
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
  // The communication thread is inside MPI and cannot be interrupted: end the process; mpirun
  // (or dtrain-launch) ends the rest of the job when a rank exits non-zero.
  std::_Exit(1);
}

}  // namespace dtrain
