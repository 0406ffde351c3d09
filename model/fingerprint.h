// parameters_fingerprint(): a 64-bit hash (FNV-1a) of every parameter's bytes, in parameter
// order. Replicas that are bitwise equal have equal fingerprints, so ranks can compare their
// models by exchanging 8 bytes (tests, and the trainer's --json summary).
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/module.h"

namespace dtrain {

uint64_t parameters_fingerprint(Module& module);

// FNV-1a continued over `bytes` from `h` (the offset basis to start): the hash above, for other
// byte sequences (a pipeline's stages' fingerprints, app/pipeline_report.cpp).
constexpr uint64_t kFingerprintBasis = 1469598103934665603ull;
uint64_t fingerprint_bytes(const void* bytes, size_t n, uint64_t h = kFingerprintBasis);

}  // namespace dtrain
