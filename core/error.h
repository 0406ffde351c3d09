// Error types and the check macro every layer uses. Library-specific macros (MPI_CHECK,
// CUDA_CHECK, NCCL_CHECK, CUBLAS_CHECK) live next to their library and report through
// check_failed() so every failure names file, line, call and the library's own string.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace dtrain {

// A runtime failure: bad input, a failed library call, a broken invariant.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A wrong command-line flag or value: the CLI prints it and exits with status 2.
class UsageError : public Error {
 public:
  using Error::Error;
};

// Throws Error("<file>:<line>: <what> failed: <detail>"), file trimmed to the project path.
[[noreturn]] void check_failed(const char* file, int line, const char* what, const std::string& detail);

}  // namespace dtrain

// DTRAIN_CHECK(cond, "format {}", args...): throws dtrain::Error naming file, line and condition.
#define DTRAIN_CHECK(cond, ...)                                                        \
  do {                                                                                 \
    if (!(cond)) ::dtrain::check_failed(__FILE__, __LINE__, #cond, fmt::format(__VA_ARGS__)); \
  } while (0)
