// MPI_CHECK(call): the one check macro for MPI calls. A failed call throws dtrain::Error naming
// file, line, the call and MPI's own error string (communicators use MPI_ERRORS_RETURN, so
// errors come back as return codes instead of aborting inside the library).
#pragma once

#include <string>

#include <mpi.h>

#include "core/error.h"

namespace dtrain {

// MPI_Error_string for `code`, or the bare number when MPI cannot name it.
inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", code);
  return std::string(text, static_cast<size_t>(len));
}

}  // namespace dtrain

#define MPI_CHECK(call)                                                                          \
  do {                                                                                           \
    int dtrain_mpi_rc_ = (call);                                                                 \
    if (dtrain_mpi_rc_ != MPI_SUCCESS)                                                           \
      ::dtrain::library_call_failed(__FILE__, __LINE__, #call, ::dtrain::mpi_error_string(dtrain_mpi_rc_)); \
  } while (0)
