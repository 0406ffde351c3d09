// Ranks agree on their settings before the first collective that depends on them. Ranks started
// with different flags (an MPMD mpirun line, a wrapper script that differs per node, an edited
// config on one host) would otherwise issue different collectives, or different numbers of
// them, and wait for each other forever. One allgather at start-up compares every setting that
// shapes the collectives or the step count and names the first that differs.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "app/train_config.h"
#include "comm/communicator.h"

namespace dtrain {

// The settings every rank must share, as (flag, value) in a fixed order: the flag as a user
// wrote it (`--bucket-cap-mb`), the value as text. `train_samples`/`test_samples`: the sizes of
// the data this rank loaded (another --data directory on one node changes the step count).
std::vector<std::pair<std::string, std::string>> shared_settings(const TrainConfig& config, int64_t train_samples,
                                                                 int64_t test_samples);

// The first setting on which ranks differ, in one line naming it, each distinct value and the
// ranks that hold it; empty when all agree. `all[r]` is rank r's shared_settings(), encoded.
std::string first_disagreement(const std::vector<std::string>& all);

// Collective: every rank's settings against every other's; throws AgreedError (the same line on
// every rank, a usage error) when they differ.
void check_ranks_agree(Communicator& control, const std::vector<std::pair<std::string, std::string>>& settings);

}  // namespace dtrain
