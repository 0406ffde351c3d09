#include "train/root_broadcast.h"

#include <algorithm>

#include <fmt/format.h>

#include "comm/exchange.h"

namespace dtrain {

std::vector<std::string> broadcast_from_root(Communicator& comm,
                                             const std::function<std::vector<std::string>()>& produce, int root) {
  std::vector<std::string> parts;
  std::string error;  // "" or the kind (one digit) and the message, so that every rank exits alike
  if (comm.rank() == root) {
    try {
      parts = produce();
    } catch (const Error& e) {
      error = fmt::format("{}{}", static_cast<int>(e.kind()), e.what());
      parts.clear();
    }
  }
  // The outcome first, so that every rank knows whether parts follow.
  error = broadcast_string(comm, error, root);
  if (!error.empty()) throw AgreedError(error.substr(1), static_cast<ErrorKind>(error[0] - '0'));
  uint64_t count = parts.size();
  comm.broadcast(&count, static_cast<int64_t>(sizeof count), DType::kU8, root);
  parts.resize(count);
  for (std::string& part : parts) part = broadcast_string(comm, part, root);
  return parts;
}

void agreed_across_ranks(Communicator& comm, const std::function<void()>& work) {
  std::string mine;  // the kind's number, a tab, the line
  try {
    work();
  } catch (const Error& e) {
    mine = fmt::format("{}\t{}", static_cast<int>(e.kind()), e.what());
  }
  const std::vector<std::string> verdicts = allgather_strings(comm, mine);
  for (size_t r = 0; r < verdicts.size(); ++r) {
    if (verdicts[r].empty()) continue;
    const bool all_alike = std::all_of(verdicts.begin(), verdicts.end(), [&](const std::string& v) { return v == verdicts[r]; });
    const size_t tab = verdicts[r].find('\t');
    const std::string line = verdicts[r].substr(tab + 1);
    throw AgreedError(all_alike ? line : fmt::format("rank {}: {}", r, line),
                      static_cast<ErrorKind>(std::stoi(verdicts[r].substr(0, tab))));
  }
}

}  // namespace dtrain
