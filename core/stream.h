// Stream and Event: the ordering of device work, as the DDP reducer expresses it.
// Reducer: bucket ready -> record an event on the compute stream -> the communication stream
// waits on it -> all-reduce on the communication stream -> the optimizer's stream waits on the
// all-reduce's event. On CUDA these are cudaEvent/cudaStream calls and no host thread blocks;
// on CPU, work is synchronous, so an event is complete when recorded and waits are no-ops.
// The same reducer code drives both, and tests on CPU can substitute a recording Stream.
#pragma once

#include <memory>

#include "core/device.h"

namespace dtrain {

class Event {
 public:
  virtual ~Event() = default;
  virtual bool query() const = 0;   // true when the recorded work has finished
  virtual void synchronize() = 0;   // host waits for the recorded work
};

class Stream {
 public:
  virtual ~Stream() = default;
  virtual Device device() const = 0;
  // An event that completes when everything queued on this stream so far has finished.
  virtual std::shared_ptr<Event> record() = 0;
  // Work queued on this stream after this call starts only after `event` completes.
  virtual void wait(const Event& event) = 0;
  // Host waits for everything queued so far.
  virtual void synchronize() = 0;
  // The native handle (cudaStream_t on CUDA, nullptr on CPU).
  virtual void* native() const { return nullptr; }
};

// The stream that runs forward, backward and the optimizer on `device` (one per process).
Stream& compute_stream(Device device);
// A fresh stream on `device` (the communication and copy streams).
std::unique_ptr<Stream> make_stream(Device device);

}  // namespace dtrain
