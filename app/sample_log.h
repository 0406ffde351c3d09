// A test hook: with DTRAIN_TEST_SAMPLE_LOG=PREFIX in the environment, every rank appends to
// PREFIX.rank<R> one line per batch it trains on, "<epoch> <step> <sample index>...", where
// <step> is the global optimizer step the batch is part of (counting from 1). The end-to-end
// tests use it to check that a run resumed at another world size uses every sample of the
// epoch once. Without the variable it does nothing.
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>

namespace dtrain {

class SampleLog {
 public:
  static constexpr const char* kEnv = "DTRAIN_TEST_SAMPLE_LOG";

  explicit SampleLog(int rank);
  ~SampleLog();
  SampleLog(const SampleLog&) = delete;
  SampleLog& operator=(const SampleLog&) = delete;

  bool enabled() const { return file_ != nullptr; }
  void record(int64_t epoch, int64_t step, std::span<const int64_t> samples);

 private:
  std::FILE* file_ = nullptr;
};

}  // namespace dtrain
