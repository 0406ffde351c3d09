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

namespace detail {
template <class T>
std::string bytes_of(const std::vector<T>& v) {
  static_assert(std::is_trivially_copyable_v<T>, "values move as their bytes");
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}
template <class T>
std::vector<T> values_of(const std::string& bytes) {
  std::vector<T> v(bytes.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));  // an empty vector's data() may be null
  return v;
}
}  // namespace detail

// Rank `root`'s vector of trivially copyable values, on every rank (any length).
template <class T>
std::vector<T> broadcast_values(Communicator& comm, const std::vector<T>& mine, int root = 0) {
  return detail::values_of<T>(broadcast_string(comm, detail::bytes_of(mine), root));
}

// Every rank's vector of trivially copyable values (of any length), indexed by rank.
template <class T>
std::vector<std::vector<T>> allgather_vectors(Communicator& comm, const std::vector<T>& mine) {
  std::vector<std::vector<T>> out;
  for (const std::string& bytes : allgather_strings(comm, detail::bytes_of(mine)))
    out.push_back(detail::values_of<T>(bytes));
  return out;
}

}  // namespace dtrain
