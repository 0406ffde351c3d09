#include "model/fingerprint.h"

#include <vector>

#include "core/memory.h"

namespace dtrain {

uint64_t parameters_fingerprint(Module& module) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a offset basis
  std::vector<unsigned char> host;
  for (Parameter* p : module.parameters()) {
    host.resize(p->value.nbytes());
    copy_bytes(host.data(), Device::cpu(), p->value.raw(), p->value.device(), host.size());
    for (unsigned char byte : host) h = (h ^ byte) * 1099511628211ull;  // FNV prime
  }
  return h;
}

}  // namespace dtrain
