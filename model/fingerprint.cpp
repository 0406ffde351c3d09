#include "model/fingerprint.h"

#include <vector>

#include "core/memory.h"

namespace dtrain {

uint64_t fingerprint_bytes(const void* bytes, size_t n, uint64_t h) {
  const auto* b = static_cast<const unsigned char*>(bytes);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;  // FNV prime
  return h;
}

uint64_t parameters_fingerprint(Module& module) {
  uint64_t h = kFingerprintBasis;
  std::vector<unsigned char> host;
  for (Parameter* p : module.parameters()) {
    host.resize(p->value.nbytes());
    copy_bytes(host.data(), Device::cpu(), p->value.raw(), p->value.device(), host.size());
    h = fingerprint_bytes(host.data(), host.size(), h);
  }
  return h;
}

}  // namespace dtrain
