// DumpOnRequest: a watchdog's answer to SIGUSR1 (request_flight_recorder_dump in
// comm/flight_recorder.h): when the process-wide count of dump requests has grown since the last
// look, write the recorder and say where in one line. Header-only, and the count is read through
// a function pointer, because the NCCL plugin does not link comm (Note [GPU plugins without a
// cycle] in core/gpu_backend.h): comm hands it &flight_recorder_dump_requests through
// NcclOptions::dump_requests. The MPI watchdog passes the same function directly.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>

namespace dtrain {

class DumpOnRequest {
 public:
  using Counter = uint64_t (*)();
  using Dump = std::function<std::string(const std::string& reason)>;  // the reason in, where (or why not) out

  DumpOnRequest() = default;
  // `label` names the recorder in the line ("" for MPI's; "nccl": "flight recorder (nccl): PATH").
  // A null counter or an empty dump never dumps. Requests made before construction are not
  // answered.
  DumpOnRequest(int rank, const std::string& label, Counter requests, Dump dump)
      : rank_(rank), label_(label.empty() ? label : " (" + label + ")"), requests_(dump ? requests : nullptr),
        dump_(std::move(dump)), seen_(requests_ ? requests_() : 0) {}

  // On the watchdog's thread, every poll: one dump per call however many requests came since
  // the last (signals that arrive together are answered once). True when it dumped.
  bool poll() {
    if (!requests_) return false;
    const uint64_t asked = requests_();
    if (asked == seen_) return false;
    seen_ = asked;
    const std::string where = dump_("SIGUSR1");
    std::fprintf(stderr, "dtrain: rank %d: flight recorder%s: %s\n", rank_, label_.c_str(), where.c_str());
    return true;
  }

 private:
  int rank_ = 0;
  std::string label_;  // "" or " (nccl)"
  Counter requests_ = nullptr;
  Dump dump_;
  uint64_t seen_ = 0;
};

}  // namespace dtrain
