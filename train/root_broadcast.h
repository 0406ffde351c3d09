// Data one rank reads and every rank receives. Checkpoints and weight files are read by rank 0
// alone, so the nodes of a job need not share a filesystem, and broadcast. A failure on rank 0
// becomes the same AgreedError on every rank, so that all of them stop alike: the CLI prints the
// line once and every rank exits normally with a non-zero status (no rank is left waiting, and
// no MPI_Abort is needed). Part of the train layer (train/checkpointer.h saves and restores
// through it); a library user's program catches AgreedError as the CLI does.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"

namespace dtrain {

// An error every rank raised with the same message and kind at the same point.
class AgreedError : public Error {
 public:
  using Error::Error;
};

// Rank `root` runs `produce`; every rank returns what it produced. An Error thrown by `produce`
// is thrown on every rank as an AgreedError with its message and kind. A collective.
std::vector<std::string> broadcast_from_root(Communicator& comm,
                                             const std::function<std::vector<std::string>()>& produce, int root = 0);

// Runs `work`, which every rank runs on the same (broadcast) data and so fails alike on every
// rank; its Error becomes an AgreedError of the same kind.
template <class Work>
auto agreed(Work&& work) -> decltype(work()) {
  try {
    return work();
  } catch (const AgreedError&) {
    throw;
  } catch (const Error& e) {
    throw AgreedError(e.what(), e.kind());
  }
}

// Every rank runs `work` on its own data (a pipeline stage's memory check, the token shards a
// rank opens): if any rank's throws an Error, every rank throws the lowest such rank's as an
// AgreedError of its kind (its line prefixed "rank r: " unless every rank's line is the same),
// so all stop alike instead of the others waiting for it in their next collective. A collective.
void agreed_across_ranks(Communicator& comm, const std::function<void()>& work);

}  // namespace dtrain
