#include "app/sample_log.h"

#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain {

SampleLog::SampleLog(int rank) {
  const char* prefix = std::getenv(kEnv);
  if (!prefix || !*prefix) return;
  const std::string path = fmt::format("{}.rank{}", prefix, rank);
  file_ = std::fopen(path.c_str(), "a");
  if (!file_) throw Error(fmt::format("{}: cannot open {} for appending", kEnv, path));
}

SampleLog::~SampleLog() {
  if (file_) std::fclose(file_);
}

void SampleLog::record(int64_t epoch, int64_t step, std::span<const int64_t> samples) {
  if (!file_) return;
  fmt::print(file_, "{} {} {}\n", epoch, step, fmt::join(samples, " "));
  std::fflush(file_);  // a rank killed later must leave what it trained on
}

}  // namespace dtrain
