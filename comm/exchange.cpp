#include "comm/exchange.h"

#include <algorithm>
#include <cstdint>

namespace dtrain {

std::string broadcast_string(Communicator& comm, const std::string& mine, int root) {
  uint64_t length = mine.size();
  comm.broadcast(&length, static_cast<int64_t>(sizeof length), DType::kU8, root);
  std::string out = comm.rank() == root ? mine : std::string(length, '\0');
  comm.broadcast(out.data(), static_cast<int64_t>(length), DType::kU8, root);
  return out;
}

std::vector<std::string> allgather_strings(Communicator& comm, const std::string& mine) {
  // Lengths first, then every string padded to the longest (allgather moves equal blocks).
  const std::vector<uint64_t> lengths = allgather_values<uint64_t>(comm, mine.size());
  const uint64_t block = *std::max_element(lengths.begin(), lengths.end());
  std::string send = mine;
  send.resize(block, '\0');
  std::string all(block * lengths.size(), '\0');
  comm.allgather(send.data(), all.data(), static_cast<int64_t>(block), DType::kU8);
  std::vector<std::string> out;
  for (size_t r = 0; r < lengths.size(); ++r) out.push_back(all.substr(r * block, lengths[r]));
  return out;
}

}  // namespace dtrain
