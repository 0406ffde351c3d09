#include "core/error.h"

#include <cstring>

namespace dtrain {

static const char* project_relative(const char* file) {
  // __FILE__ is absolute in CMake builds; keep the part from the layer folder on.
  for (const char* layer : {"/core/", "/comm/", "/model/", "/data/", "/checkpoint/", "/ddp/", "/launcher/", "/examples/", "/tests/"}) {
    if (const char* p = std::strstr(file, layer)) return p + 1;
  }
  return file;
}

void check_failed(const char* file, int line, const char* what, const std::string& detail) {
  std::string msg = fmt::format("{}:{}: {} failed", project_relative(file), line, what);
  if (!detail.empty()) msg += ": " + detail;
  throw Error(msg);
}

}  // namespace dtrain
