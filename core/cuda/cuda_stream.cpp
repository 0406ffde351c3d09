// CUDA streams and events (see cuda_stream.h), and the per-device compute streams behind
// cuda::compute_stream().
#include "core/cuda/cuda_stream.h"

#include <array>
#include <atomic>
#include <mutex>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/device_guard.h"

namespace dtrain::cuda {

// Deleters run in destructors, possibly at exit after the runtime is gone: never throw.
void StreamDeleter::operator()(cudaStream_t s) const {
  if (s) (void)cudaStreamDestroy(s);
}
void EventDeleter::operator()(cudaEvent_t e) const {
  if (e) (void)cudaEventDestroy(e);
}

CudaEvent::CudaEvent(int device) {
  DeviceGuard guard(device);  // events belong to the device current at creation
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  event_.reset(e);
}

bool CudaEvent::query() const {
  const cudaError_t status = cudaEventQuery(event_.get());
  if (status == cudaSuccess) return true;
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();  // "not ready" is an answer, not an error: keep it out of later checks
    return false;
  }
  library_call_failed(__FILE__, __LINE__, "cudaEventQuery", cudaGetErrorString(status));
}

void CudaEvent::synchronize() { CUDA_CHECK(cudaEventSynchronize(event_.get())); }

CudaStream::CudaStream(int device) : device_(device) {
  DeviceGuard guard(device);
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_.reset(s);
}

std::shared_ptr<Event> CudaStream::record() {
  auto event = std::make_shared<CudaEvent>(device_);
  CUDA_CHECK(cudaEventRecord(event->native(), stream_.get()));
  return event;
}

void CudaStream::wait(const Event& event) {
  if (const auto* cuda_event = dynamic_cast<const CudaEvent*>(&event)) {
    CUDA_CHECK(cudaStreamWaitEvent(stream_.get(), cuda_event->native(), 0));
    return;
  }
  DTRAIN_CHECK(event.query(), "a CUDA stream was asked to wait on a non-CUDA event that is not complete");
}

void CudaStream::synchronize() { CUDA_CHECK(cudaStreamSynchronize(stream_.get())); }

namespace {

// One compute stream per device, created on first use and never destroyed (destroying it at
// exit would race the CUDA runtime's tear-down; the driver reclaims it with the context).
std::array<std::atomic<CudaStream*>, kMaxDevices> g_compute_streams{};
std::mutex g_compute_streams_mutex;

}  // namespace

Stream& compute_stream(int device) {
  DTRAIN_CHECK(device >= 0 && device < kMaxDevices, "CUDA device {} beyond dtrain's limit of {}", device,
               kMaxDevices);
  CudaStream* stream = g_compute_streams[device].load(std::memory_order_acquire);
  if (!stream) {
    std::lock_guard lock(g_compute_streams_mutex);
    stream = g_compute_streams[device].load(std::memory_order_relaxed);
    if (!stream) {
      stream = new CudaStream(device);
      g_compute_streams[device].store(stream, std::memory_order_release);
    }
  }
  return *stream;
}

Stream& compute_stream() { return compute_stream(current_device()); }

cudaStream_t compute_stream_handle() { return static_cast<cudaStream_t>(compute_stream().native()); }

std::unique_ptr<Stream> make_stream(int device) { return std::make_unique<CudaStream>(device); }


}  // namespace dtrain::cuda
