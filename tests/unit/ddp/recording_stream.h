// Streams that log what is asked of them, for the CPU tests of stream ordering (the reducer's,
// the comm hooks'): `record` and `wait` append "NAME.record(ID)" / "NAME.wait(ID)" to
// ordering_log(), so a test reads the order the code under test asked for.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/stream.h"

namespace dtrain::testing {

inline std::vector<std::string>& ordering_log() {
  static std::vector<std::string> log;
  return log;
}

struct LoggedEvent : Event {
  int id;
  explicit LoggedEvent(int i) : id(i) {}
  bool query() const override { return true; }
  void synchronize() override {}
};

struct RecordingStream : Stream {
  std::string name;
  int next = 0;
  explicit RecordingStream(std::string n) : name(std::move(n)) {}
  Device device() const override { return Device::cpu(); }
  std::shared_ptr<Event> record() override {
    auto e = std::make_shared<LoggedEvent>(next++);
    ordering_log().push_back(fmt::format("{}.record({})", name, e->id));
    return e;
  }
  void wait(const Event& e) override {
    const auto* logged = dynamic_cast<const LoggedEvent*>(&e);  // else another stream's (a global one's)
    ordering_log().push_back(logged ? fmt::format("{}.wait({})", name, logged->id) : name + ".wait(an unlogged event)");
  }
  void synchronize() override {}
};

}  // namespace dtrain::testing
