// parameters_fingerprint(): a 64-bit hash (FNV-1a) of every parameter's bytes, in parameter
// order. Replicas that are bitwise equal have equal fingerprints, so ranks can compare their
// models by exchanging 8 bytes (tests, and the trainer's --json summary).
#pragma once

#include <cstdint>

#include "model/module.h"

namespace dtrain {

uint64_t parameters_fingerprint(Module& module);

}  // namespace dtrain
