// Host<->device and device<->device copies, memset and synchronisation, all on the compute
// stream so they are ordered with the kernels that produce and consume the data.
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_stream.h"

namespace dtrain::cuda {

void copy(void* dst, bool dst_on_device, const void* src, bool src_on_device, size_t bytes) {
  if (bytes == 0) return;
  const cudaMemcpyKind kind = dst_on_device ? (src_on_device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                            : (src_on_device ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  const cudaStream_t stream = compute_stream_handle();
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream));
  // The contract is "returns once the copy is complete": host buffers may be reused at once.
  CUDA_CHECK(cudaStreamSynchronize(stream));
}

void zero(void* dst, size_t bytes) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, compute_stream_handle()));
}

void synchronize() { compute_stream().synchronize(); }

}  // namespace dtrain::cuda
