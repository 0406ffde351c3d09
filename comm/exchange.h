// Typed exchanges over any Communicator: strings and plain records move as bytes (DType::kU8),
// so callers never pack text into numeric words. Each is a collective: every rank calls it, in
// the same order as its other collectives.
#pragma once

#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "comm/communicator.h"

namespace dtrain {

// Rank `root`'s string, on every rank.
std::string broadcast_string(Communicator& comm, const std::string& mine, int root = 0);

// Every rank's string, indexed by rank (strings of any length).
std::vector<std::string> allgather_strings(Communicator& comm, const std::string& mine);

// Every rank's copy of a trivially copyable value, indexed by rank.
template <class T>
std::vector<T> allgather_values(Communicator& comm, const T& mine) {
  static_assert(std::is_trivially_copyable_v<T>, "values move as their bytes");
  std::vector<T> all(static_cast<size_t>(comm.size()));
  comm.allgather(&mine, all.data(), static_cast<int64_t>(sizeof(T)), DType::kU8);
  return all;
}

}  // namespace dtrain
