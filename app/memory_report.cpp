#include "app/memory_report.h"

#include <fmt/format.h>

#include "core/memory.h"

namespace dtrain {

std::string memory_line(Optimizer& optimizer, int zero_stage, int ranks) {
  FlatStore& store = optimizer.store();
  const std::string how =
      ranks == 1 || zero_stage == 0
          ? (ranks == 1 ? "one rank: everything whole" : "--zero 0: every rank holds everything")
          : fmt::format("--zero {} over {} ranks: optimizer state for this rank's 1/{} of each bucket{}", zero_stage, ranks,
                        ranks,
                        zero_stage == 2 ? (store.grads_lent() ? "; gradients: this rank's 1/N reduced, and a ring "
                                                                "of bucket buffers lent during backward"
                                                              : "; gradients reduce-scattered, the whole local gradient "
                                                                "kept (accumulation needs it: --accumulate, a pipeline's "
                                                                "micro-batches; or it is smaller than the ring of two "
                                                                "buckets)")
                                        : "");
  return fmt::format("memory per rank: parameters {}, gradients {}, optimizer state {} ({})",
                     format_bytes(static_cast<double>(store.values().nbytes())),
                     format_bytes(static_cast<double>(store.grad_bytes())),
                     format_bytes(static_cast<double>(optimizer.state_bytes())), how);
}

}  // namespace dtrain
