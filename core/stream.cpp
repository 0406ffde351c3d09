#include "core/stream.h"

#include "core/error.h"
#include "core/gpu_backend.h"

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
  return gpu_backend().compute_stream(device.index);
}

std::unique_ptr<Stream> make_stream(Device device) {
  if (device.is_cpu()) return std::make_unique<CpuStream>();
  return gpu_backend().make_stream(device.index);
}

}  // namespace dtrain
