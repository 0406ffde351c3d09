// CUDA_CHECK and CUBLAS_CHECK: the one check macro per library (see core/error.h). A failed
// call throws dtrain::Error naming file, line, the call and the library's own error string.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/error.h"

#define CUDA_CHECK(call)                                                                     \
  do {                                                                                       \
    const cudaError_t dtrain_cuda_status_ = (call);                                          \
    if (dtrain_cuda_status_ != cudaSuccess)                                                  \
      ::dtrain::library_call_failed(__FILE__, __LINE__, #call, cudaGetErrorString(dtrain_cuda_status_)); \
  } while (0)

#define CUBLAS_CHECK(call)                                                                   \
  do {                                                                                       \
    const cublasStatus_t dtrain_cublas_status_ = (call);                                     \
    if (dtrain_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                      \
      ::dtrain::library_call_failed(__FILE__, __LINE__, #call, cublasGetStatusString(dtrain_cublas_status_)); \
  } while (0)
