// error_of: the message and kind of the Error a piece of work throws, for the data tests' checks
// that a bad input is one line of the right kind.
#pragma once

#include <string>
#include <utility>

#include "core/error.h"

namespace dtrain::testing {

// ("", kFailure) when `work` throws none.
template <class Work>
std::pair<std::string, ErrorKind> error_of(Work work) {
  try {
    work();
  } catch (const Error& e) {
    return {e.what(), e.kind()};
  }
  return {"", ErrorKind::kFailure};
}

}  // namespace dtrain::testing
