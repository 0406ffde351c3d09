#include "core/error.h"

#include <string_view>

namespace dtrain {

namespace {

// __FILE__ is absolute in CMake builds: keep the part inside the source tree, whatever the folder
// (DTRAIN_SOURCE_DIR, "<tree>/", is set by the build), so that an error line names `app/x.cpp`
// rather than where this copy of the sources happens to live. A file outside the tree (a program
// built against the installed library) keeps its own path.
std::string_view project_relative(std::string_view file) {
#ifdef DTRAIN_SOURCE_DIR
  constexpr std::string_view kSourceDir = DTRAIN_SOURCE_DIR;
  if (!kSourceDir.empty() && file.starts_with(kSourceDir)) return file.substr(kSourceDir.size());
#endif
  // ccache with CCACHE_BASEDIR makes __FILE__ relative to the build folder ("../../app/x.cpp").
  while (file.starts_with("../") || file.starts_with("./")) file.remove_prefix(file.starts_with("./") ? 2 : 3);
  return file;
}

}  // namespace

void check_failed(const char* file, int line, const char* what, const std::string& detail) {
  std::string msg = fmt::format("{}:{}: {} failed", project_relative(file), line, what);
  if (!detail.empty()) msg += ": " + detail;
  throw Error(msg);
}

void library_call_failed(const char* file, int line, const char* what, const std::string& detail) {
  try {
    check_failed(file, line, what, detail);
  } catch (Error& e) {
    e.mark_library_call_failure();
    throw;
  }
}

}  // namespace dtrain
