// FlightRecorder (see flight_recorder.h): the ring, the labels and the JSON dump.
#include "comm/flight_recorder.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "core/temp_files.h"

namespace dtrain {

namespace {

std::mutex context_mu;
std::string context;                 // process-wide, under context_mu
thread_local std::string detail;     // this thread's
std::atomic<uint64_t> dump_requests{0};

}  // namespace

const char* collective_state_name(CollectiveState state) {
  switch (state) {
    case CollectiveState::kEnqueued: return "enqueued";
    case CollectiveState::kStarted: return "started";
    case CollectiveState::kCompleted: return "completed";
    case CollectiveState::kFailed: return "failed";
  }
  return "?";
}

FlightRecorder::FlightRecorder(size_t capacity, std::string communicator)
    : capacity_(capacity == 0 ? 1 : capacity), communicator_(std::move(communicator)) {
  ring_.reserve(capacity_);
}

int64_t FlightRecorder::enqueue(const char* kind, DType dtype, int64_t count) {
  CollectiveRecord r;
  r.kind = kind;
  r.dtype = dtype;
  r.count = count;
  r.label = collective_label();
  r.enqueued_ns = steady_now_ns();
  std::lock_guard lock(mu_);
  r.seq = next_seq_++;
  if (ring_.size() < capacity_) {
    ring_.push_back(std::move(r));
  } else {
    ring_[static_cast<size_t>((r.seq - 1) % static_cast<int64_t>(capacity_))] = std::move(r);
  }
  return next_seq_ - 1;
}

CollectiveRecord* FlightRecorder::find_locked(int64_t seq) {
  if (seq <= 0 || seq >= next_seq_ || next_seq_ - seq > static_cast<int64_t>(capacity_)) return nullptr;
  return &ring_[static_cast<size_t>((seq - 1) % static_cast<int64_t>(capacity_))];
}

void FlightRecorder::started(int64_t seq) {
  const int64_t now = steady_now_ns();
  std::lock_guard lock(mu_);
  if (CollectiveRecord* r = find_locked(seq)) {
    r->state = CollectiveState::kStarted;
    r->started_ns = now;
  }
}

void FlightRecorder::finished(int64_t seq, bool ok) {
  const int64_t now = steady_now_ns();
  std::lock_guard lock(mu_);
  if (CollectiveRecord* r = find_locked(seq)) {
    r->state = ok ? CollectiveState::kCompleted : CollectiveState::kFailed;
    r->completed_ns = now;
  }
}

std::vector<CollectiveRecord> FlightRecorder::snapshot() const {
  std::lock_guard lock(mu_);
  std::vector<CollectiveRecord> out;
  out.reserve(ring_.size());
  const int64_t first = std::max<int64_t>(1, next_seq_ - static_cast<int64_t>(ring_.size()));
  for (int64_t seq = first; seq < next_seq_; ++seq)
    out.push_back(ring_[static_cast<size_t>((seq - 1) % static_cast<int64_t>(capacity_))]);
  return out;
}

int64_t FlightRecorder::last_seq() const {
  std::lock_guard lock(mu_);
  return next_seq_ - 1;
}

std::string FlightRecorder::to_json(int rank, int size, const std::string& reason,
                                    const std::vector<int>& unresponsive) const {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const int64_t now = steady_now_ns();
  nlohmann::json records = nlohmann::json::array();
  for (const CollectiveRecord& r : snapshot()) {
    records.push_back({{"seq", r.seq},
                       {"kind", r.kind},
                       {"dtype", dtype_name(r.dtype)},
                       {"count", r.count},
                       {"label", r.label},
                       {"state", collective_state_name(r.state)},
                       {"enqueued_ns", r.enqueued_ns},
                       {"started_ns", r.started_ns},
                       {"completed_ns", r.completed_ns}});
  }
  const nlohmann::json doc = {{"format", "dtrain-flight-recorder-1"}, {"communicator", communicator_},
                              {"rank", rank}, {"world_size", size},
                              {"host", host}, {"pid", static_cast<int64_t>(getpid())}, {"reason", reason},
                              {"unresponsive_ranks", unresponsive}, {"dumped_ns", now}, {"records", records}};
  return doc.dump(1);
}

std::string FlightRecorder::dump_path(const std::string& dir, int rank, const std::string& communicator) {
  const std::string name = communicator == "mpi" ? fmt::format("flight_recorder_rank{}.json", rank)
                                                 : fmt::format("flight_recorder_rank{}_{}.json", rank, communicator);
  return (std::filesystem::path(dir.empty() ? "." : dir) / name).string();
}

std::string FlightRecorder::dump(const std::string& dir, int rank, int size, const std::string& reason,
                                 const std::vector<int>& unresponsive, std::string& error) const {
  namespace fs = std::filesystem;
  const fs::path path = dump_path(dir, rank, communicator_);
  // A dump cut short (the rank killed mid-write) leaves its temporary: the next dump removes it.
  remove_stale_temporaries(path.string());
  const fs::path tmp = temporary_path(path.string());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << to_json(rank, size, reason, unresponsive) << '\n';
    out.flush();
    if (!out) {
      error = fmt::format("cannot write {}", tmp.string());
      std::error_code ignored;
      fs::remove(tmp, ignored);
      return "";
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    error = fmt::format("cannot rename {} to {}: {}", tmp.string(), path.string(), ec.message());
    return "";
  }
  return path.string();
}

void set_collective_context(std::string text) {
  std::lock_guard lock(context_mu);
  context = std::move(text);
}

ScopedCollectiveDetail::ScopedCollectiveDetail(std::string text) : previous_(std::move(detail)) {
  detail = std::move(text);
}

ScopedCollectiveDetail::~ScopedCollectiveDetail() { detail = std::move(previous_); }

std::string collective_detail() { return detail; }

std::string collective_label() {
  std::string label;
  {
    std::lock_guard lock(context_mu);
    label = context;
  }
  if (!detail.empty()) label += label.empty() ? detail : " | " + detail;
  return label;
}

void request_flight_recorder_dump() { dump_requests.fetch_add(1, std::memory_order_relaxed); }

uint64_t flight_recorder_dump_requests() { return dump_requests.load(std::memory_order_relaxed); }

}  // namespace dtrain
