// Error types and the check macro every layer uses. Library-specific macros (MPI_CHECK,
// CUDA_CHECK, NCCL_CHECK, CUBLAS_CHECK) live next to their library and report through
// check_failed() so every failure names file, line, call and the library's own string.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace dtrain {

// What a failure was about, so that a program can say whether running it again may help: the
// command line maps each kind to one exit status (core/exit_status.h, Note [Exit statuses]).
enum class ErrorKind {
  kFailure,     // none of the below: a peer, a timeout, a library call, a broken invariant
  kUsage,       // a flag or setting (the same command line fails the same way)
  kData,        // the training or test data: missing, unreadable, malformed
  kCheckpoint,  // a checkpoint or weights file that is damaged or does not match the run
  kResources,   // the model or data does not fit in memory
  kOutput,      // an output path that cannot be written
  kDiverged,    // a NaN or an infinity in training (where no vote of every rank reports it)
};

// A runtime failure: bad input, a failed library call, a broken invariant.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, ErrorKind kind = ErrorKind::kFailure)
      : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }
  // For a caller that knows what a failure of its callee is about (classify_errors below).
  void set_kind(ErrorKind kind) noexcept { kind_ = kind; }
  // A failed MPI, NCCL or CUDA call (library_call_failed): a peer, the network or the device,
  // never the files the caller was reading, so classify_errors leaves it a kFailure.
  bool is_library_call_failure() const noexcept { return library_call_; }
  void mark_library_call_failure() noexcept { library_call_ = true; }

 private:
  ErrorKind kind_;
  bool library_call_ = false;
};

// A wrong command-line flag or value: the CLI prints it and exits with status 2.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& what) : Error(what, ErrorKind::kUsage) {}
};

// Runs `work`; an Error it throws without a kind of its own (kFailure) leaves with `kind`: the
// caller knows what its callee's failures are about (every failure to read the training data is
// bad data) where the callee, a general library, does not. The exception keeps its type.
template <class Work>
auto classify_errors(ErrorKind kind, Work&& work) -> decltype(work()) {
  try {
    return work();
  } catch (Error& e) {
    if (e.kind() == ErrorKind::kFailure && !e.is_library_call_failure()) e.set_kind(kind);
    throw;
  }
}

// Throws Error("<file>:<line>: <what> failed: <detail>"), file relative to the source tree.
[[noreturn]] void check_failed(const char* file, int line, const char* what, const std::string& detail);
// The same for a failed MPI, NCCL, CUDA or cuBLAS call (their check macros): the Error is marked
// so that no caller classifies it as a fault of its data or checkpoint (a restart may fix it).
[[noreturn]] void library_call_failed(const char* file, int line, const char* what, const std::string& detail);

}  // namespace dtrain

// DTRAIN_CHECK(cond, "format {}", args...): throws dtrain::Error naming file, line and condition.
#define DTRAIN_CHECK(cond, ...)                                                        \
  do {                                                                                 \
    if (!(cond)) ::dtrain::check_failed(__FILE__, __LINE__, #cond, fmt::format(__VA_ARGS__)); \
  } while (0)
