// Host<->device and device<->device copies, memset and synchronisation, on the compute
// stream so they are ordered with the kernels that produce and consume the data; and the
// pinned host memory and asynchronous copies on other streams (the input copy stream).
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_stream.h"

namespace dtrain::cuda {

namespace {

cudaMemcpyKind copy_kind(bool dst_on_device, bool src_on_device) {
  return dst_on_device ? (src_on_device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                       : (src_on_device ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
}

}  // namespace

void copy(void* dst, bool dst_on_device, const void* src, bool src_on_device, size_t bytes) {
  if (bytes == 0) return;
  const cudaMemcpyKind kind = copy_kind(dst_on_device, src_on_device);
  const cudaStream_t stream = compute_stream_handle();
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream));
  // The contract is "returns once the copy is complete" for host memory (it may be reused at
  // once); a device-to-device copy is stream-ordered like any kernel, so the host need not wait.
  if (!dst_on_device || !src_on_device) CUDA_CHECK(cudaStreamSynchronize(stream));
}

void copy_async(void* dst, bool dst_on_device, const void* src, bool src_on_device, size_t bytes, Stream& stream) {
  if (bytes == 0) return;
  DTRAIN_CHECK(stream.device().is_cuda() && stream.native() != nullptr,
               "copy_async needs a CUDA stream, got one on {}", stream.device().str());
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, copy_kind(dst_on_device, src_on_device),
                             static_cast<cudaStream_t>(stream.native())));
}

void* alloc_pinned(size_t bytes) {
  if (bytes == 0) return nullptr;
  // On a thread that never chose a device this moves it to the process's one, so the first
  // CUDA call does not create a context on device 0.
  (void)current_device();
  void* ptr = nullptr;
  // Portable: pinned for every device's context, not only the current one.
  CUDA_CHECK(cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable));
  return ptr;
}

void free_pinned(void* ptr) {
  if (ptr) (void)cudaFreeHost(ptr);  // may run at exit, after the runtime is gone: never throw
}

void zero(void* dst, size_t bytes) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, compute_stream_handle()));
}


}  // namespace dtrain::cuda
