// CudaStream / CudaEvent: dtrain::Stream and dtrain::Event over cudaStream_t / cudaEvent_t,
// owning their handles. Internal to core/cuda and comm/nccl (includes CUDA headers); the
// rest of dtrain sees only core/stream.h.
#pragma once

#include <memory>
#include <type_traits>

#include <cuda_runtime.h>

#include "core/stream.h"

namespace dtrain::cuda {

struct StreamDeleter {
  void operator()(cudaStream_t s) const;
};
struct EventDeleter {
  void operator()(cudaEvent_t e) const;
};
using StreamHandle = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDeleter>;
using EventHandle = std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, EventDeleter>;

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(int device);  // timing disabled: cheaper to record and to wait on
  bool query() const override;     // throws dtrain::Error if the recorded work failed
  void synchronize() override;
  cudaEvent_t native() const { return event_.get(); }

 private:
  EventHandle event_;
};

class CudaStream final : public Stream {
 public:
  explicit CudaStream(int device);  // non-blocking: no implicit sync with the legacy stream
  Device device() const override { return Device::cuda(device_); }
  std::shared_ptr<Event> record() override;
  // A CudaEvent: cudaStreamWaitEvent (no host block). Any other event is a CPU one, complete
  // when recorded, so there is nothing to wait for.
  void wait(const Event& event) override;
  void synchronize() override;
  void* native() const override { return stream_.get(); }
  cudaStream_t handle() const { return stream_.get(); }

 private:
  int device_;
  StreamHandle stream_;
};

// The native handle of the current device's compute stream.
cudaStream_t compute_stream_handle();

}  // namespace dtrain::cuda
