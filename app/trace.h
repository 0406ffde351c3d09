// Tracer: per-rank spans (forward, backward, each bucket's all-reduce, optimizer step) written
// as one Chrome trace JSON for all ranks (pid = rank), which opens in Perfetto / chrome://tracing.
// DDP's part of a step comes from its record of the last backward (BackwardTiming).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "ddp/distributed_data_parallel.h"

namespace dtrain {

struct TraceSpan {
  std::string name;
  const char* category;  // "compute" or "comm"
  int tid;               // 0: compute thread, 1: communication
  int64_t start_ns, end_ns;
};

class Tracer {
 public:
  explicit Tracer(bool enabled) : enabled_(enabled) {}
  bool enabled() const { return enabled_; }
  void add(std::string name, const char* category, int tid, int64_t start_ns, int64_t end_ns);
  // The backward, the wait for its all-reduces, and each bucket's all-reduce (thread 1).
  void add_backward(const BackwardTiming& timing);
  const std::vector<TraceSpan>& spans() const { return spans_; }

  // Time covered by all-reduce spans, and the part of it that lies inside backward spans.
  struct Overlap {
    double allreduce_ns = 0, overlapped_ns = 0;
  };
  Overlap backward_overlap() const;

  // Collective: gathers every rank's spans to rank 0, which writes `path` atomically
  // (temporary file, then rename). Returns the overlap summed over ranks.
  Overlap write(const std::string& path, Communicator& comm) const;

 private:
  bool enabled_;
  std::vector<TraceSpan> spans_;
};

// Records [construction, destruction) as a compute span when the tracer is enabled.
class ScopedSpan {
 public:
  ScopedSpan(Tracer* tracer, const char* name)
      : tracer_(tracer && tracer->enabled() ? tracer : nullptr), name_(name), start_(tracer_ ? steady_now_ns() : 0) {}
  ~ScopedSpan() {
    if (tracer_) tracer_->add(name_, "compute", 0, start_, steady_now_ns());
  }
  ScopedSpan(const ScopedSpan&) = delete;
  ScopedSpan& operator=(const ScopedSpan&) = delete;

 private:
  Tracer* tracer_;
  const char* name_;
  int64_t start_;
};

}  // namespace dtrain
