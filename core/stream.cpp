#include "core/stream.h"

#include "core/error.h"
#ifdef DTRAIN_WITH_CUDA
#include "core/cuda/cuda_backend.h"
#endif

namespace dtrain {

namespace {

class CpuEvent final : public Event {
 public:
  bool query() const override { return true; }
  void synchronize() override {}
};

class CpuStream final : public Stream {
 public:
  Device device() const override { return Device::cpu(); }
  std::shared_ptr<Event> record() override { return std::make_shared<CpuEvent>(); }
  void wait(const Event&) override {}
  void synchronize() override {}
};

}  // namespace

Stream& compute_stream(Device device) {
  if (device.is_cpu()) {
    static CpuStream cpu;
    return cpu;
  }
#ifdef DTRAIN_WITH_CUDA
  return cuda::compute_stream(device.index);
#else
  throw Error("this dtrain binary was built without CUDA");
#endif
}

std::unique_ptr<Stream> make_stream(Device device) {
  if (device.is_cpu()) return std::make_unique<CpuStream>();
#ifdef DTRAIN_WITH_CUDA
  return cuda::make_stream(device.index);
#else
  throw Error("this dtrain binary was built without CUDA");
#endif
}

}  // namespace dtrain
