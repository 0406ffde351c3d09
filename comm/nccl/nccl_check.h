// NCCL_CHECK: the one check macro for NCCL (see core/error.h). A failed call throws
// dtrain::Error naming file, line, the call, NCCL's error string and NCCL's last message.
#pragma once

#include <string>

#include <nccl.h>

#include "core/error.h"

namespace dtrain {

// "unhandled system error (run with NCCL_DEBUG=INFO for details): <ncclGetLastError text>"
inline std::string nccl_error_detail(ncclResult_t result, ncclComm_t comm = nullptr) {
  std::string detail = ncclGetErrorString(result);
  const char* last = ncclGetLastError(comm);
  if (last && *last) detail += fmt::format(": {}", last);
  return detail;
}

}  // namespace dtrain

#define NCCL_CHECK(call)                                                                            \
  do {                                                                                              \
    const ncclResult_t dtrain_nccl_status_ = (call);                                                \
    if (dtrain_nccl_status_ != ncclSuccess)                                                         \
      ::dtrain::library_call_failed(__FILE__, __LINE__, #call, ::dtrain::nccl_error_detail(dtrain_nccl_status_)); \
  } while (0)
